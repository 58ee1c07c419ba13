"""Every value a user can type is checked as the program will use it: a float
in the dtype it has on the device (float32: overflow to inf, underflow to 0,
rounding onto the end of its range), an integer in the range its use allows
(a seed in the PRNG key's 32 bits), for every config field and every numeric
flag of every tool, by one mechanism (compressive/values.py)."""

import dataclasses
import importlib
import json
import logging
import math
import pathlib
import re
import time

from absl import flags
import pytest

from compressive import cli, cli_config, cli_flags, cli_parse_errors, nested, values
from compressive import config as config_lib
from compressive.errors import ConfigError, MeshError
from compressive.model.config import MAX_LAYERS, MAX_UNROLLED_LAYERS, ModelConfig
from compressive.scale import processes as processes_lib
from helpers import ROOT, tiny_experiment, untrained_workdir
import inprocess


def float_fields(config, prefix=""):
  """(dotted name, value) of every float leaf of a ConfigDict or mapping,
  inside tuples too (name[i]): found by walking the config as written, not
  by asking the groups which fields they declare."""
  for key, value in config.items():
    name = f"{prefix}{key}"
    if hasattr(value, "items"):
      yield from float_fields(value, name + ".")
    elif isinstance(value, (tuple, list)):
      yield from ((f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, float))
    elif isinstance(value, float):
      yield name, value


FLOAT_FIELDS = [name for name, _ in float_fields(tiny_experiment())]


def refused(config, field):
  with pytest.raises(ConfigError) as raised:
    config_lib.check(config)
  message = str(raised.value)
  assert message.startswith(f"{field}=") and "\n" not in message, message
  return message


def test_the_float_fields_are_found_in_every_section():
  assert {
    "optimizer.learning_rate",
    "optimizer.eps",
    "optimizer.b2",
    "model.dropout_rate",
    "data.books.heldout_fraction",
    "data.text_files.heldout_fraction",
    "data.hf_datasets.heldout_fraction",
    "data.spm_character_coverage",
  } <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize(
  "bad, what",
  [
    (1e39, "overflows to inf in float32"),
    (1e-300, "underflows to 0 in float32"),
    (-1e-41, "underflows to the subnormal"),
    (float("nan"), "must be"),
  ],
)
def test_every_float_field_is_checked_as_float32(field, bad, what):
  # Every float field of the config, found by walking it: a field added
  # later is checked by its group (values.check_fields: its range, or
  # float32's for a float declared by its annotation alone, as
  # data.hf_datasets.heldout_fraction is) without being listed anywhere.
  assert what in refused(tiny_experiment(**{field: bad}), field)


def test_a_float_field_of_a_section_no_source_reads_is_checked_too():
  # data.books is not the source's section here: its fields are checked as
  # declared all the same, as float32 holds them, then against their range.
  config = tiny_experiment(**{"data.books.heldout_fraction": 1e39})
  assert "overflows to inf in float32" in refused(config, "data.books.heldout_fraction")
  config.data.books.heldout_fraction = 3.0e38  # float32 holds it, the range does not
  assert "must be a number in (0, 0.5)" in refused(config, "data.books.heldout_fraction")
  config.data.books.heldout_fraction = 0.25
  config_lib.check(config)


def test_a_float_a_schema_declares_by_its_annotation_alone_is_held_to_float32():
  # A plugin source's schema may declare a field by its annotation, with no
  # __post_init__: values.from_dict checks its fields as the groups do theirs.
  @dataclasses.dataclass(frozen=True)
  class Schema:
    scale: float = 1.0

  for bad, what in (
    (1e39, "overflows to inf in float32"),
    (1e-300, "underflows to 0"),
    (float("nan"), "must be a number that float32 holds"),
  ):
    with pytest.raises(ConfigError) as raised:
      values.from_dict(Schema, {"scale": bad}, "data.toy.")
    assert str(raised.value).startswith("data.toy.scale=") and what in str(raised.value)
  assert values.from_dict(Schema, {"scale": math.inf}, "data.toy.").scale == math.inf


def test_a_field_no_group_has_is_refused_by_name():
  for section, where in (
    (None, "top level"),
    ("optimizer", "optimizer"),
    ("eval", "eval"),
    ("mesh", "mesh"),
    ("model", "model"),
    ("data.synthetic", "data.synthetic"),
    ("data.books", "data.books"),
  ):
    config = tiny_experiment()
    target = config
    for part in (section or "").split(".") if section else ():
      target = target[part]
    target.unlock()  # a config file may add a key to an unlocked section (default.get_config())
    target.new_scale = 1.0
    with pytest.raises(ConfigError) as raised:
      config_lib.check(config)
    name = "new_scale" if section is None else f"{section}.new_scale"
    assert str(raised.value).startswith(
      f"{name} is not a field of this version's config ({where}: "
    ), str(raised.value)


@pytest.mark.parametrize(
  "field, value, expected",
  [
    ("optimizer.learning_rate", 1e39, "overflows to inf in float32"),
    ("optimizer.weight_decay", 1e39, "overflows to inf in float32"),
    ("optimizer.eps", 1e-300, "underflows to 0 in float32"),
    ("optimizer.eps", 1e-40, "underflows to the subnormal"),
    (
      "optimizer.b2",
      0.9999999999,
      "(it is 1.0 in float32, the dtype it has on the device) must be in [0, 1)",
    ),
    ("optimizer.b1", 0.99999999999, "(it is 1.0 in float32"),
    ("model.dropout_rate", 0.99999999999, "(it is 1.0 in float32"),
    ("optimizer.learning_rate", 0.0, "must be a finite number > 0"),
    ("optimizer.grad_clip_norm", -math.inf, "must be > 0 (inf: no clipping)"),
  ],
)
def test_values_the_device_would_change_are_refused_naming_the_field(field, value, expected):
  assert expected in refused(tiny_experiment(**{field: value}), field)


def test_the_products_the_optimizer_computes_are_checked_too():
  message = refused(
    tiny_experiment(**{"optimizer.learning_rate": 1e20, "optimizer.weight_decay": 1e20}),
    "optimizer.learning_rate x optimizer.weight_decay",
  )
  assert "overflows to inf in float32" in message
  message = refused(
    tiny_experiment(**{"optimizer.learning_rate": 1e-30, "optimizer.final_lr_fraction": 1e-10}),
    "optimizer.learning_rate x optimizer.final_lr_fraction",
  )
  assert "underflows" in message


def test_values_float32_holds_and_infinite_clipping_are_accepted():
  # Accepted as given: a check that clamped or rounded them would fail here.
  optimizer = config_lib.check(
    tiny_experiment(
      **{"optimizer.grad_clip_norm": math.inf, "optimizer.eps": 1e-37, "optimizer.b2": 0.9999999}
    )
  ).train.optimizer
  assert (optimizer.grad_clip_norm, optimizer.eps, optimizer.b2) == (math.inf, 1e-37, 0.9999999)


@pytest.mark.parametrize(
  "field, value",
  [
    ("seed", -1),
    ("seed", 2**32 - 1),
    ("seed", 2**32),
    ("seed", 2**64),
    ("seed", True),
    ("data.synthetic.seed", -1),
    ("data.recall.seed", -1),
    ("data.spm_train_seed", 2**32),
    ("data.cache_tokens", -1),
    ("optimizer.warmup_steps", 2**31),
    ("eval.max_segments", 2**31),
    ("eval.memory_length", 2**31),
    ("eval.batch_size", -2),
  ],
)
def test_integers_are_checked_against_the_range_their_use_allows(field, value):
  config = tiny_experiment()
  config.data.recall.seed = 0
  if field == "data.recall.seed":
    config.data.source, config.data.tokenizer = "recall", "bytes"
  target = config
  *path, last = field.split(".")
  for p in path:
    target = target[p]
  target[last] = value
  message = refused(config, field)
  assert "must be" in message


def test_the_largest_seed_whose_dropout_key_still_fits_is_accepted():
  assert config_lib.check(tiny_experiment(seed=2**32 - 2)).train.seed == 2**32 - 2


# -- Flags. ----------------------------------------------------------------------


@pytest.fixture
def flag():
  """Defines a float flag and an integer flag for one test."""
  flags.DEFINE_float("h31_float", None, "test")
  flags.DEFINE_integer("h31_int", None, "test")
  flags.FLAGS.mark_as_parsed()
  yield flags.FLAGS
  for name in ("h31_float", "h31_int"):
    delattr(flags.FLAGS, name)


@pytest.mark.parametrize(
  "value, interval, expected",
  [
    (1e39, "[0, inf)", "--h31_float=1e+39 overflows to inf in float32"),
    (1e-300, "(0, 1]", "--h31_float=1e-300 underflows to 0 in float32"),
    (0.99999999999, "(0, 1)", "--h31_float=0.99999999999 (it is 1.0 in float32"),
    (float("nan"), "[0, inf)", "--h31_float=nan must be a number in [0, inf)"),
    (-0.5, "[0, inf)", "--h31_float=-0.5 must be a number in [0, inf)"),
  ],
)
def test_a_float_flag_is_checked_as_float32(flag, value, interval, expected):
  cli_flags.validate_number_flag("h31_float", interval)
  with pytest.raises(flags.IllegalFlagValueError) as raised:
    flag.h31_float = value
  # absl's `flag --name=VALUE: ` before the check's own line.
  assert str(raised.value).split(": ", 1)[1].startswith(expected), str(raised.value)


def test_an_integer_flag_is_checked_against_its_range(flag):
  cli_flags.validate_int_flag("h31_int", "[-1, 2**31)")
  with pytest.raises(
    flags.IllegalFlagValueError,
    match=r": --h31_int=2147483648 must be an integer in \[-1, 2\*\*31\)",
  ):
    flag.h31_int = 2**31
  flag.h31_int = -1
  cli_flags.validate_number_flag("h31_float", "[0, inf)", dtype="float64")  # a host-only value
  flag.h31_float = 1e300


TOOLS = ("eval", "sample", "analyze", "export", "train", "aot.__main__", "train_tokenizer")
# Numeric flags whose values depend on each other, checked together by
# processes.initialize_distributed (the test below) when a tool joins the
# multi-host runtime (reading.command, train.py).
CHECKED_TOGETHER = {"num_processes", "process_id"}


@pytest.fixture
def tool_flags():
  """Defines a tool's flags as it does when it runs (its `define_flags`) and
  returns them; afterwards removes them, so that every tool defines its
  flags afresh and no other test sees them."""
  defined = []

  def define(tool):
    before = set(flags.FLAGS)
    defined.append(before)
    importlib.import_module(f"compressive.{tool}").define_flags()
    return {flag: flags.FLAGS[flag] for flag in set(flags.FLAGS) - before}

  defaults = dict(cli_config.DEFAULT_CONFIGS)
  yield define
  for before in defined:
    for flag in set(flags.FLAGS) - before:
      delattr(flags.FLAGS, flag)
  cli_config.DEFAULT_CONFIGS.clear()
  cli_config.DEFAULT_CONFIGS.update(defaults)


@pytest.mark.parametrize("tool", TOOLS)
def test_every_numeric_flag_of_every_tool_checks_its_own_value(tool, tool_flags):
  # Each integer or float flag a tool defines (itself, or through the flag
  # groups of cli_flags.define_*_flags) carries its check, registered where it is
  # defined (cli_flags.validate_int_flag, cli_flags.validate_number_flag): absl runs it
  # as the command line is parsed. A value beyond every range is refused,
  # naming the flag, so the check is a real one.
  own = tool_flags(tool)
  assert own, f"{tool} defined no flag"
  numeric = {
    name: flag
    for name, flag in own.items()
    if isinstance(flag.parser, (flags.IntegerParser, flags.FloatParser))
  }
  unchecked = {name for name, flag in numeric.items() if not flag.validators} - CHECKED_TOGETHER
  assert not unchecked, f"{tool}: numeric flags without a check: {sorted(unchecked)}"
  for name, flag in numeric.items():
    if name in CHECKED_TOGETHER:
      continue
    bad = 2**40 if isinstance(flag.parser, flags.IntegerParser) else math.nan
    with pytest.raises(flags.IllegalFlagValueError, match=re.escape(f": --{name}={bad}")):
      setattr(flags.FLAGS, name, bad)


def test_a_flag_groups_check_is_one_line_when_the_command_line_is_parsed():
  # absl reports a failed validator as `flag --name=VALUE: MESSAGE`; the
  # entry points print the message alone (the table of user messages in
  # test_entry_point_errors.py runs the tools).
  error = flags.IllegalFlagValueError("flag --step=-1: --step=-1 must be >= 0, below 2**31")
  assert (
    cli_parse_errors.parse_failure(["eval.py", "--step=-1"], error)
    == "--step=-1 must be >= 0, below 2**31"
  )


@pytest.mark.parametrize(
  "address, processes, process, expected",
  [
    ("localhost", 2, 0, "coordinator_address='localhost' must be HOST:PORT"),
    ("localhost:99999", 2, 0, "with a port in [1, 65535]"),
    ("localhost:1234", 0, 0, "num_processes=0 must be an integer >= 1"),
    ("localhost:1234", 2, 2, "process_id=2 must be an integer in [0, num_processes=2)"),
    ("localhost:1234", 2, -1, "process_id=-1 must be"),
  ],
)
def test_the_multi_host_values_are_checked_before_jax_waits_for_peers(
  address, processes, process, expected
):
  with pytest.raises(ConfigError, match=re.escape(expected)):
    processes_lib.initialize_distributed(
      coordinator_address=address, num_processes=processes, process_id=process
    )


# -- Sizes of every kind go through the memory estimate, before anything is built. --


@pytest.mark.parametrize(
  "field, value, expected",
  [
    ("model.d_ff", 2**31 - 1, "training this config needs at least"),
    ("model.vocab_size", 2**31 - 1, "training this config needs at least"),
    ("eval.memory_length", 10**9, "evaluating this config needs at least"),
    ("eval.batch_size", 2**30, "evaluating this config needs at least"),
  ],
)
def test_every_size_is_estimated_before_the_model_is_built(field, value, expected, monkeypatch):
  def never(*args):
    raise AssertionError("the model was built before the estimate")

  monkeypatch.setattr(config_lib, "abstract_model", never)
  with pytest.raises(ConfigError, match=expected):
    config_lib.check(tiny_experiment(**{field: value}))


def test_evaluation_sizes_are_estimated_for_the_tools_too():
  # eval.py, analyze.py and sample.py check a saved config with check_saved
  # (training=False), their memory flags set as the evaluation sizes.
  with pytest.raises(ConfigError, match="evaluating this config needs at least .* memory slots"):
    config_lib.check_saved(tiny_experiment(), sizes={"memory_length": 2**31 - 1})


@pytest.mark.parametrize(
  "shape,said",
  [
    (("0", "1", "1"), "entries must be positive integers or -1"),
    (("-1", "-1", "1"), "has more than one -1"),
  ],
)
def test_a_bad_mesh_shape_for_a_saved_config_points_at_mesh_shape(shape, said):
  # A mesh.shape entry is refused as a mesh error (MeshError): a tool reading
  # a saved config (its --mesh_shape) says how to choose this machine's mesh.
  hint = r".*\(set --mesh_shape for this machine\)$"
  with pytest.raises(MeshError, match=re.escape(said) + hint):
    config_lib.check_saved(tiny_experiment(), mesh_shape=shape)


def test_a_targets_memory_bounds_the_size_before_the_model_is_built(monkeypatch):
  # aot.py passes its target's memory: a model far too large for it is
  # refused in a moment, not after minutes of building it.
  monkeypatch.setattr(config_lib, "abstract_model", lambda *a: pytest.fail("built"))
  with pytest.raises(ConfigError, match=r"needs at least .* of cpu's memory"):
    config_lib.check(
      tiny_experiment(**{"model.num_layers": 64, "model.d_model": 4096}),
      num_devices=1,
      capacity=(2**30, "cpu's memory"),
    )


@pytest.mark.parametrize(
  "layers, scan, expected",
  [
    (20000, False, "unrolled layers is more than 64, .* set model.scan_layers=True"),
    (MAX_UNROLLED_LAYERS + 1, False, "set model.scan_layers=True"),
    (20000, True, "more than 128 layers, which take minutes to build even scanned"),
    (2**31 - 1, True, "more than 128 layers"),
  ],
)
def test_a_model_too_deep_to_build_in_time_is_refused_before_it_is_built(
  layers, scan, expected, monkeypatch
):
  # A tiny model of 20,000 layers fits any memory, but building it (every
  # layer's initialisers traced: time growing as the layers squared) and
  # compiling it unrolled takes minutes to hours: train.py, the tools that
  # check a saved config (eval.py, sample.py, analyze.py) and aot.py (its
  # target's devices and memory) refuse it in a moment, as does the model
  # config every reader builds from a saved or exported config.
  monkeypatch.setattr(config_lib, "abstract_model", lambda *a: pytest.fail("built"))
  config = lambda: tiny_experiment(**{"model.num_layers": layers, "model.scan_layers": scan})
  start = time.monotonic()
  for check in (
    lambda: config_lib.check(config()),
    lambda: config_lib.check_saved(config()),
    lambda: config_lib.check(config(), num_devices=1, capacity=(2**40, "cpu's memory")),
    lambda: ModelConfig.from_config(config().model),
  ):
    with pytest.raises(ConfigError, match=expected) as e:
      check()
    assert "\n" not in str(e.value)
  assert time.monotonic() - start < 5


def test_the_deepest_allowed_models_pass_the_model_check():
  # The bounds leave room above the paper's deepest model (36 layers).
  for layers, scan in ((36, False), (MAX_UNROLLED_LAYERS, False), (MAX_LAYERS, True)):
    assert ModelConfig.from_config(
      tiny_experiment(**{"model.num_layers": layers, "model.scan_layers": scan}).model
    )
  assert MAX_UNROLLED_LAYERS >= 36


# -- Results written as JSON are valid JSON: never NaN. -----------------------------


def strict_json(text):
  def refuse(constant):
    raise AssertionError(f"{constant} is not JSON")

  return json.loads(text, parse_constant=refuse)


def test_non_finite_results_are_named_or_written_as_null():
  result = {"loss": float("nan"), "bits": [1.0, float("inf")], "split": "test", "n": 3}
  assert nested.non_finite(result) == ["loss=nan", "bits[1]=inf"]
  assert nested.finite_or_null(result) == {
    "loss": None,
    "bits": [1.0, None],
    "split": "test",
    "n": 3,
  }
  strict_json(json.dumps(nested.finite_or_null(result), allow_nan=False))


def test_a_metrics_record_with_a_non_finite_value_is_valid_json(tmp_path):
  from compressive.training.metrics import MetricWriter

  writer = MetricWriter(str(tmp_path), "eval")
  writer.write(6, {"loss": float("nan"), "bits_per_token": 1.5})
  writer.close()
  lines = (tmp_path / "metrics_eval.jsonl").read_text().splitlines()
  assert [strict_json(line) for line in lines] == [{"step": 6, "loss": None, "bits_per_token": 1.5}]


def test_the_tools_write_results_only_through_the_one_writer_that_refuses_nan():
  # eval.py reports a non-finite result as one line (NonFiniteError, exit 1)
  # before it writes anything; analyze.py writes NaN as null; each result is
  # saved by cli.save_result, which refuses NaN (tests/tools/test_files.py),
  # and printed without it: no tool dumps JSON into a file of its own.
  for tool in ("eval", "analyze"):
    source = (pathlib.Path(ROOT) / "compressive" / f"{tool}.py").read_text()
    assert "cli.save_result(" in source, tool
    assert "cli.report_result(" in source, tool
    assert not re.findall(r"json\.dump\(|open\([^)]*[\"']w", source), tool


# eval.py as a user runs it, on a run whose evaluation comes out NaN (the
# evaluation itself replaced for the run: a diverged run's "intact" step
# evaluated to NaN once).
@pytest.mark.slow
def test_a_non_finite_evaluation_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
  from compressive.evaluation import evaluate

  workdir = untrained_workdir(tmp_path / "wd")
  before = sorted(p.name for p in pathlib.Path(workdir).iterdir())
  nan = {"loss": float("nan"), "bits_per_byte": float("inf"), "tokens": 8}
  monkeypatch.setattr(evaluate, "evaluate", lambda *a, **k: nan)
  r = inprocess.run("eval.py", [f"--workdir={workdir}", "--split=test", "--max_segments=1"])
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert lines[-1].startswith("error: ") and "loss=nan" in lines[-1], lines[-3:]
  assert "NaN" not in r.stdout and r.stdout.strip() == ""
  assert sorted(p.name for p in pathlib.Path(workdir).iterdir()) == before


@pytest.mark.parametrize(
  "seconds,shown",
  [
    (0, "0:00:00"),
    (59.9, "0:00:59"),
    (61, "0:01:01"),
    (3 * 3600 + 125, "3:02:05"),
    (-5, "0:00:00"),
    (100 * 3600, "100:00:00"),
  ],
)
def test_a_duration_is_shown_as_hours_minutes_seconds(seconds, shown):
  assert values.hms(seconds) == shown


def test_metrics_are_shown_with_counts_as_integers():
  shown = values.metrics_text({"loss": 6.19702, "tokens": 20480.0, "bits_per_byte": 2.0})
  assert shown == "loss 6.1970  tokens 20480  bits_per_byte 2"
  assert values.metrics_text({"loss": 1.5, "tokens": 128}, sep="=") == "loss=1.5000  tokens=128"


def test_long_work_reports_its_progress_only_when_it_takes_a_while(monkeypatch, caplog):
  now = [100.0]
  monkeypatch.setattr(values.time, "monotonic", lambda: now[0])
  with caplog.at_level("INFO", logger="compressive"):
    quick = values.Progress("quick", 10)
    for _ in range(10):
      now[0] += 0.1
      quick.advance()
    slow = values.Progress("recall/train: generating 400 documents", 400, after=5, every=15)
    for _ in range(400):
      now[0] += 0.125  # 50 s in all: lines after 5 s, then every 15 s
      slow.advance()
  lines = [r.getMessage() for r in caplog.records]
  assert len(lines) == 4 and not any(line.startswith("quick") for line in lines)
  assert lines[0] == "recall/train: generating 400 documents: 40 of 400 (10%), about 0:00:45 left"
  assert lines[-1].endswith("400 of 400 (100%), about 0:00:00 left")


def test_the_console_prefix_is_the_time_and_the_level_of_a_warning():
  formatter = cli.ConsoleFormatter()
  record = logging.LogRecord("compressive", logging.INFO, __file__, 1, "step %d", (4,), None)
  record.created = time.mktime((2026, 12, 4, 5, 6, 7, 0, 0, -1))
  assert formatter.format(record) == "05:06:07 step 4"
  record.levelno, record.levelname = logging.WARNING, "WARNING"
  assert formatter.format(record) == "05:06:07 warning: step 4"
