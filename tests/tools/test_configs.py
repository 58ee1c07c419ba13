"""Every experiment config loads, validates, and builds its model (abstractly:
the paper-scale models are never materialised here)."""

import ast
import dataclasses
import importlib
import math
import pathlib

from flax import nnx
import ml_collections
import pytest

import compressive
from compressive import cli_config, data
from compressive import config as config_lib
from compressive import values as values_lib
from compressive.experiment import EvalConfig, OptimizerConfig, TrainConfig
from compressive.scale.sharding import MeshConfig
import helpers
from helpers import data_of

# Every config the package ships (configs/*.py defining get_config; a preset
# taking an experiment gets its default), from the package's own listing, so
# that a new config is checked here without being listed.
CONFIGS = cli_config.config_names()


def built_shape(model) -> tuple[int, int, int]:
  """(layers, d_model, vocabulary) of a built (abstract) model, read from its
  parameters: the blocks listed, or stacked on a leading axis when scanned."""
  params = nnx.state(model, nnx.Param)
  vocab, d_model = params["embed"]["embedding"].get_value().shape
  blocks = params["blocks"]
  if "attention" in blocks:  # scanned: one stacked block
    layers = blocks["attention"]["wq"].get_value().shape[0]
  else:
    layers = len(blocks)
  return layers, d_model, vocab


def test_the_config_list_is_the_folder():
  files = {p.stem for p in pathlib.Path(helpers.ROOT, "configs").glob("*.py")}
  assert {"default", "enwik8", "pg19", "gpu8", "tpu_v5e8"} <= set(CONFIGS)
  # paper.py holds what the paper's configs share; it is no config itself.
  assert set(CONFIGS) == files - {"__init__", "_hardware", "paper"}


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates_and_builds(name):
  config = importlib.import_module(f"compressive.configs.{name}").get_config()
  # The form of the config: its data (enwik8's file, PG-19's TFDS folder)
  # and its size are this machine's to check when it trains here.
  # A preset's mesh states its devices (8 for gpu8 and tpu_v5e8; -1: any).
  shape = tuple(config.mesh.shape)
  config_lib.check(config, here=False, num_devices=None if -1 in shape else math.prod(shape))
  model = nnx.eval_shape(
    lambda: compressive.CompressiveTransformer(
      compressive.ModelConfig.from_config(config.model), rngs=nnx.Rngs(0)
    )
  )
  # What was built is what the file asks for.
  assert built_shape(model) == (
    config.model.num_layers,
    config.model.d_model,
    config.model.vocab_size,
  )


def _config_dicts(value, name="experiment"):
  """The names of the ConfigDicts anywhere inside `value` (dataclasses,
  tuples and dicts walked)."""
  if isinstance(value, ml_collections.ConfigDict):
    yield name
  elif dataclasses.is_dataclass(value):
    for f in dataclasses.fields(value):
      yield from _config_dicts(getattr(value, f.name), f"{name}.{f.name}")
  elif isinstance(value, (tuple, list)):
    for i, v in enumerate(value):
      yield from _config_dicts(v, f"{name}[{i}]")
  elif isinstance(value, dict):
    for k, v in value.items():
      yield from _config_dicts(v, f"{name}[{k!r}]")


def test_check_builds_the_typed_frozen_groups_once():
  # What the layers below the entry points read: typed, frozen, resolved.
  config = helpers.tiny_experiment(
    **{"grad_accum_steps": 2, "eval.batch_size": 3, "eval.memory_length": -1, "eval.split": "test"}
  )
  e = config_lib.check(config)
  t = e.train
  assert (
    t.seed,
    t.batch_size,
    t.num_train_steps,
    t.segments_per_step,
    t.grad_accum_steps,
    t.log_every_steps,
    t.eval_every_steps,
    t.checkpoint_every_steps,
    t.keep_checkpoints,
    t.prefetch_steps,
  ) == (config.seed, 4, 12, 2, 2, 2, 6, 3, config.keep_checkpoints, config.prefetch_steps)
  assert t.optimizer.learning_rate == config.optimizer.learning_rate
  assert t.optimizer.warmup_steps == 2 and t.optimizer.name == config.optimizer.name
  assert (t.micro_batch_rows, t.tokens_per_step, t.num_updates) == (2, 2 * 4 * 8, 24)
  # -1 takes training's size; a size given is kept.
  assert e.eval.sizes == {
    "batch_size": 3,
    "segment_length": 8,
    "memory_length": 8,
    "compressed_memory_length": 4,
  }
  assert (e.eval.split, e.eval.max_segments) == ("test", 4)
  assert e.mesh.axes == tuple(config.mesh.axes) and e.mesh.data_axes == ("data", "fsdp")
  assert e.mesh_shape == (1, 1, 1)
  # Nothing in the experiment is a ConfigDict: the data section is a
  # DataConfig, each source's section an instance of its schema.
  assert list(_config_dicts(e)) == []
  assert type(e.data).__name__ == "DataConfig" and e.data.synthetic.period == 12
  for group, field in (
    (e.train, "batch_size"),
    (e.train.optimizer, "b1"),
    (e.eval, "split"),
    (e.mesh, "axes"),
    (e.model, "d_model"),
  ):
    with pytest.raises(dataclasses.FrozenInstanceError):
      setattr(group, field, getattr(group, field))


def test_what_a_run_records_is_its_groups_and_reads_back_to_the_same_experiment(tmp_path):
  # config.json, the identity and the hparams come from Experiment.to_dict:
  # every field of every group (the ones the config left out at their
  # defaults, evaluation's sizes resolved), and checking it again gives it back.
  from compressive.training import runconfig

  config = helpers.tiny_experiment()
  del config.gradient_window, config.optimizer.b1
  e = config_lib.check(config)
  written = e.to_dict()
  assert written["gradient_window"] == 1 and written["optimizer"]["b1"] == 0.9
  assert written["eval"]["memory_length"] == 8 and "segment_length" not in {
    k for k, v in written.items() if not isinstance(v, dict)
  }
  runconfig.save_config(str(tmp_path), e)
  saved = runconfig.load_config(str(tmp_path))
  assert config_lib.check(saved).to_dict() == written == saved.to_dict()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_by_check(tmp_path):
  # The tokenizer's vocabulary against model.vocab_size is the config's
  # check, before anything is built: for a SentencePiece model (its file read
  # on the machine that runs the config) as for bytes (256, known anywhere).
  fields = helpers.sentencepiece_run_fields(tmp_path)
  vocab = data.get_tokenizer(data_of(helpers.tiny_experiment(**fields).data)).vocab_size
  assert 256 < vocab <= 320
  config = helpers.tiny_experiment(**dict(fields, **{"model.vocab_size": vocab - 1}))
  with pytest.raises(
    compressive.ConfigError,
    match=rf"model.vocab_size={vocab - 1} is smaller "
    rf"than the tokenizer's vocabulary \({vocab}\)",
  ):
    config_lib.check(config)
  config_lib.check(config, here=False, num_devices=1)  # its file is another machine's
  config_lib.check(helpers.tiny_experiment(**fields))  # model.vocab_size=320: fits
  for here in (True, False):
    with pytest.raises(compressive.ConfigError, match=r"model.vocab_size=200 .*256"):
      config_lib.check(
        helpers.tiny_experiment(**{"model.vocab_size": 200}),
        here=here,
        num_devices=None if here else 1,
      )


def test_paper_settings():
  e = importlib.import_module("configs.enwik8").get_config()
  m = e.model
  assert (
    m.num_layers,
    m.segment_length,
    m.memory_length,
    m.compressed_memory_length,
    m.compression_rate,
  ) == (24, 768, 768, 1152, 3)
  assert e.eval.compressed_memory_length == 3072
  assert (e.optimizer.learning_rate, e.optimizer.grad_clip_norm) == (3e-4, 0.1)
  p = importlib.import_module("configs.pg19").get_config().model
  for baseline in ("enwik8", "enwik8_txl", "pg19", "pg19_txl"):  # Alg. 1's post-norm layers
    assert importlib.import_module(f"configs.{baseline}").get_config().model.norm == "post"
  assert (
    p.num_layers,
    p.segment_length,
    p.memory_length,
    p.compressed_memory_length,
    p.compression_rate,
    p.vocab_size,
  ) == (36, 512, 512, 512, 2, 32000)


@pytest.mark.parametrize("paper,baseline", [("enwik8", "enwik8_txl"), ("pg19", "pg19_txl")])
def test_baselines_have_equal_attention_span(paper, baseline):
  a = importlib.import_module(f"configs.{paper}").get_config()
  b = importlib.import_module(f"configs.{baseline}").get_config()
  assert b.model.compressed_memory_length == 0
  assert b.model.memory_length == a.model.memory_length + a.model.compressed_memory_length
  assert b.eval.memory_length == a.eval.memory_length + a.eval.compressed_memory_length
  assert b.model.num_layers == a.model.num_layers and b.model.d_model == a.model.d_model


# -- The configs are data on the declared defaults. --------------------------------------


def _structure(value, name=""):
  """Every node of a ConfigDict as (name, what it is): its class, lock and
  type safety and fields in order, or a leaf's type and repr; equal
  structures are the same config, bit for bit."""
  if isinstance(value, ml_collections.ConfigDict):
    yield name, (type(value).__name__, value.is_locked, value.is_type_safe, tuple(value._fields))
    for key, child in value._fields.items():
      yield from _structure(child, f"{name}.{key}")
  else:
    yield name, (type(value).__name__, repr(value))


def test_the_default_config_writes_only_its_model():
  # Every field is declared once, on its group (type, default, range,
  # meaning); configs/default.py starts from those declarations
  # (config.default_config) and writes only the model it chooses: the sizes,
  # which no group gives a default, and its norm. Everything else, lock and
  # type included, is the declared default: a field added to a group is in
  # the default config, and overridable, without a line here.
  from compressive.configs import default

  written, declared = default.get_config(), config_lib.default_config()
  chosen = {
    "vocab_size",
    "num_layers",
    "num_heads",
    "d_model",
    "d_ff",
    "segment_length",
    "memory_length",
    "compressed_memory_length",
    "compression_rate",
    "norm",
  }
  model = written.model.to_dict()
  assert {k for k in model if model[k] != declared.model.get(k)} == chosen
  for k in chosen - {"norm"}:  # the sizes: no group declares them
    del written.model[k]
  written.model.norm = declared.model.norm
  assert list(_structure(written)) == list(_structure(declared))
  assert list(_structure(declared.data)) == list(_structure(data.default_data_config()))
  assert declared.mesh.to_dict() == values_lib.to_dict(MeshConfig())
  top = {k: v for k, v in declared.items() if not isinstance(v, ml_collections.ConfigDict)}
  for section, group in (
    (top, TrainConfig()),
    (declared.optimizer.to_dict(), OptimizerConfig()),
    (declared.eval.to_dict(), EvalConfig()),
  ):
    expected = values_lib.to_dict(group)
    expected.pop("optimizer", None)
    assert section == expected, type(group).__name__


def test_the_structure_sees_a_changed_type_order_and_lock():
  c = ml_collections.ConfigDict({"a": 1, "b": {"c": (1, 2)}})
  same = list(_structure(c))
  for changed in (
    {"a": 1.0, "b": {"c": (1, 2)}},
    {"a": 1, "b": {"c": [1, 2]}},
    {"b": {"c": (1, 2)}, "a": 1},
  ):
    assert list(_structure(ml_collections.ConfigDict(changed))) != same
  c.lock()
  assert list(_structure(c)) != same


def test_config_files_import_only_ml_collections_and_each_other():
  # big_vision's habit: a config file is data. It may build on another
  # shipped config (from the package compressive.configs, or importlib for a
  # preset's experiment) or on the declared defaults (compressive.config's
  # default_config, and nothing else of the library), never on a top-level
  # `configs`, which a folder of the user's could shadow.
  wrong = []
  for path in sorted(pathlib.Path(helpers.ROOT, "configs").glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module == "compressive.config":
        names = [f"compressive.config.{a.name}" for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [node.module or ""] if not node.level else ["(relative)"]
      else:
        continue
      wrong += [
        f"{path.name} imports {n}"
        for n in names
        if n
        not in (
          "ml_collections",
          "importlib",
          "os",
          "compressive.configs",
          "compressive.config.default_config",
        )
        and not n.startswith("compressive.configs.")
      ]
  assert wrong == []
