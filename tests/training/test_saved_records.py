"""Every group refuses what it does not know, and every record's version is
known: a config file, the command line, a workdir's config.json, a
checkpoint's recorded identity and an export's are read by one declaration
per group (values.from_dict, values.check_section), so a field no group
has, or a value of another kind, is one line naming it, from every reader;
and an integrity record is read only as a version this code writes (one
that names no version cannot be told from a newer one stripped of its
checks, so it is not read).

The runs here are untrained (helpers.untrained_workdir): a checkpoint as
training leaves it, in seconds, with nothing compiled."""

import os
import re
import textwrap

import pytest

import compressive
from compressive import config as config_lib
from compressive.errors import CheckpointError, ConfigError
from compressive.training import export as export_lib
from compressive.training import exporting, integrity, runconfig
from helpers import copy_tree, edit_json, tiny_experiment, untrained_workdir, write_config_file
import inprocess

RECORD = os.path.join("checkpoints", "1", "integrity", "metadata")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return untrained_workdir(tmp_path_factory.mktemp("run") / "wd")


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("exported") / "out")
  exporting.export(run, out)
  return out


def reseal(export):
  """An export's digests written again, as someone crafting one would."""

  def fix(manifest):
    manifest["config_sha256"] = export_lib.file_digest(os.path.join(export, "config.json"))
    manifest["sha256"] = export_lib.manifest_digest(manifest)

  edit_json(os.path.join(export, "export.json"), fix)


def one_line(result, *expected):
  """The tool's result is one `error:` line holding each of `expected`, exit 2."""
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
    result.returncode,
    result.stderr[-3000:],
  )
  assert all(e in lines[0] for e in expected), lines[0]
  return lines[0]


def mine(tmp_path, body):
  """A config file built on the shipped default, as docs/TRAINING.md shows."""
  path = tmp_path / "mine.py"
  path.write_text(
    "from compressive.configs import default\n\n\ndef get_config():\n"
    "  c = default.get_config()\n" + textwrap.indent(textwrap.dedent(body), "  ") + "  return c\n"
  )
  return str(path)


# -- A config file, the command line. ------------------------------------------------


def test_a_config_file_with_a_field_the_model_does_not_know_is_one_line(tmp_path):
  # The issue's: `dropout` meant dropout_rate, `compression_rte` compression_rate;
  # they trained the defaults, and --print_config showed the typos as set.
  config = mine(
    tmp_path,
    """
      c.model.dropout = 0.3
      c.model.compression_rte = 4
      """,
  )
  for extra in (
    ["--print_config"],
    [f"--workdir={tmp_path}/wd", "--dry_run"],
    [f"--workdir={tmp_path}/wd"],
  ):
    line = one_line(
      inprocess.run("train.py", [f"--config={config}", *extra]),
      "model.compression_rte is not a field of this version's config (model: ",
    )
    assert "compression_rate" in line  # the fields it has, to choose from
  assert not os.path.lexists(tmp_path / "wd")


@pytest.mark.parametrize(
  "body,named",
  [
    ("c.mesh.unlock()\nc.mesh.axis = ('data',)\n", "mesh.axis is not a field"),
    (
      "c.data.synthetic.unlock()\nc.data.synthetic.sede = 1\n",
      "data.synthetic.sede is not a field",
    ),
    (
      "c.unlock()\nc.learning_rate = 0.1\n",
      "learning_rate is not a field of this version's config (top level: ",
    ),
    ("c.eval.unlock()\nc.eval.max_segment = 3\n", "eval.max_segment is not a field"),
  ],
  ids=["mesh field", "data source field", "top level", "eval field"],
)
def test_every_group_refuses_a_field_it_does_not_know(tmp_path, body, named):
  # (A value of another kind than a field's the config file's ConfigDict
  # refuses itself.)
  one_line(inprocess.run("train.py", [f"--config={mine(tmp_path, body)}", "--print_config"]), named)


def test_a_ModelConfig_refuses_what_it_does_not_know_wherever_it_is_built():
  section = dict(tiny_experiment().model)
  with pytest.raises(ConfigError, match="^model.memory_len is not a field"):
    compressive.ModelConfig.from_config({**section, "memory_len": 4})
  with pytest.raises(ConfigError, match=r"^model.num_layers='2' must be an integer, not str"):
    compressive.ModelConfig.from_config({**section, "num_layers": "2"})


# -- A workdir's config.json, as every reader and the trainer read it. ----------------


@pytest.mark.parametrize(
  "edit,named",
  [
    # The issue's: read with exit 0, the model built from the rest.
    (lambda c: c["model"].update(num_layerz=2, memory_len=4), "model.memory_len is not a field"),
    (
      lambda c: c["data"]["synthetic"].update(max_length="256"),
      "data.synthetic.max_length='256' must be an integer, not str",
    ),
    (lambda c: c.update(eval=None), "eval must be a section of fields, not null"),
    (lambda c: c["mesh"].update(shape="x"), "mesh.shape='x' must be a tuple, not str"),
    (lambda c: c["data"].update(synthetc={"seed": 1}), "data.synthetc is not a field"),
    (lambda c: c["optimizer"].update(b1="0.9"), "optimizer.b1='0.9' must be a number, not str"),
    (lambda c: c.update(batch_size=True), "batch_size=True must be an integer, not bool"),
  ],
  ids=[
    "model fields",
    "a string for an int",
    "eval null",
    "a string for a tuple",
    "a data section",
    "a string for a float",
    "a bool for an int",
  ],
)
def test_a_config_json_holding_what_no_version_writes_is_damage_to_every_reader(
  run, tmp_path, edit, named
):
  workdir = copy_tree(run, tmp_path)
  edit_json(workdir / "config.json", edit)
  with pytest.raises(CheckpointError, match=f"config.json is damaged .*{named}"):
    runconfig.load_config(str(workdir))
  for tool in ("eval.py", "sample.py"):
    one_line(
      inprocess.run(
        tool,
        [f"--workdir={workdir}", "--max_segments=1"]
        if tool == "eval.py"
        else [f"--workdir={workdir}", "--prompt=ab", "--num_tokens=2"],
      ),
      f"{workdir}/config.json is damaged (",
      named,
    )


def test_a_section_of_a_source_not_registered_here_is_left_to_that_sources_check(run, tmp_path):
  # A plugin registered under a plain name, read without its module: not
  # damage, but one line naming the source.
  workdir = copy_tree(run, tmp_path)
  edit_json(workdir / "config.json", lambda c: c["data"].update(source="mine", mine={"n": 1}))
  config = runconfig.load_config(str(workdir))
  with pytest.raises(ConfigError, match="^data.source='mine' is unknown; choose one of"):
    config_lib.check_saved(config)


def test_the_trainer_sets_such_a_config_json_aside_and_resumes_from_its_checkpoints(
  run, tmp_path, caplog
):
  workdir = copy_tree(run, tmp_path)
  edit_json(workdir / "config.json", lambda c: c["model"].update(num_layerz=2))
  runconfig.check_resume_config(str(workdir), config_lib.check(tiny_experiment()))
  assert (workdir / "config.json.damaged").exists() and not (workdir / "config.json").exists()
  assert "model.num_layerz is not a field" in caplog.text


# -- A checkpoint's identity, an export's. -------------------------------------------


@pytest.mark.parametrize(
  "edit,named",
  [
    (
      lambda r: r["identity"]["model"].update(num_layerz=2),
      "identity.model.num_layerz is not a field",
    ),
    (
      lambda r: r["identity"]["model"].update(num_layers="2"),
      "identity.model.num_layers='2' must be an integer, not str",
    ),
    (
      lambda r: r["identity"]["data"]["synthetic"].update(sede=1),
      "identity.data.synthetic.sede is not a field",
    ),
    (
      lambda r: r["identity"]["data"].update(books={}),
      "identity.data.books is not the section of data.source='synthetic'",
    ),
  ],
  ids=["model field", "model kind", "data field", "data section"],
)
def test_a_checkpoint_identity_holding_what_no_version_records_is_damage(
  run, tmp_path, edit, named
):
  workdir = copy_tree(run, tmp_path)
  edit_json(workdir / RECORD, edit)
  with pytest.raises(
    integrity.DamagedCheckpointError, match=f"is damaged: its integrity record's {named}"
  ):
    compressive.load(str(workdir))
  one_line(
    inprocess.run("eval.py", [f"--workdir={workdir}", "--max_segments=1"]),
    "is damaged: its integrity record's",
    named,
  )


@pytest.mark.parametrize(
  "edit,named",
  [
    (
      lambda m: m["identity"]["model"].update(memory_len=4),
      "identity.model.memory_len is not a field",
    ),
    (
      lambda m: m["identity"]["data"]["synthetic"].update(seed="0"),
      "identity.data.synthetic.seed='0' must be an integer, not str",
    ),
    (lambda m: m.update(identity_v3={}), "'identity_v3', a field no export of version 2 holds"),
  ],
  ids=["model field", "data kind", "export field"],
)
def test_an_export_holding_what_no_version_records_is_damage(exported, tmp_path, edit, named):
  out = copy_tree(exported, tmp_path)
  edit_json(out / "export.json", edit)
  reseal(str(out))
  with pytest.raises(CheckpointError, match=f"export.json is damaged: its {re.escape(named)}"):
    compressive.load(str(out))


# -- Every record's version is known. ------------------------------------------------


def strip_to_before_version_2(record):
  """The issue's: a version 2 record as records of before version 2 were."""
  record.pop("version")
  record["identity"].pop("data")
  record["identity"].pop("corpus")


def test_a_record_stripped_to_before_version_2_is_not_read(run, tmp_path):
  # With data.synthetic.seed edited in config.json, eval.py evaluated
  # another corpus and train.py resumed on other data (exit 0).
  workdir = copy_tree(run, tmp_path)
  edit_json(workdir / RECORD, strip_to_before_version_2)
  edit_json(workdir / "config.json", lambda c: c["data"]["synthetic"].update(seed=1))
  expected = "integrity record names no version"
  with pytest.raises(integrity.UnknownRecordError, match=expected):
    compressive.load(str(workdir))
  one_line(inprocess.run("eval.py", [f"--workdir={workdir}", "--max_segments=1"]), expected)
  config = write_config_file(tmp_path / "c.py", {"data.synthetic.seed": 1, "num_train_steps": 2})
  for extra in ([], ["--restore_intact"]):  # not damage: never moved aside
    one_line(
      inprocess.run("train.py", [f"--config={config}", f"--workdir={workdir}", *extra]), expected
    )
    assert (workdir / RECORD).exists() and not (workdir / "checkpoints" / "skipped").exists()


@pytest.mark.parametrize(
  "version,error,expected",
  [
    (None, integrity.UnknownRecordError, "names no version"),  # the version alone removed
    (3, integrity.UnknownRecordError, "newer version of compressive (integrity record version 3"),
    (1, integrity.DamagedCheckpointError, "its integrity record's version is 1"),
    ("2", integrity.DamagedCheckpointError, "its integrity record's version is '2'"),
    (True, integrity.DamagedCheckpointError, "its integrity record's version is True"),
  ],
  ids=["none", "newer", "one", "a string", "a bool"],
)
def test_a_record_is_read_only_as_a_version_this_code_writes(
  run, tmp_path, version, error, expected
):
  workdir = copy_tree(run, tmp_path)
  edit_json(
    workdir / RECORD, lambda r: r.pop("version") if version is None else r.update(version=version)
  )
  with pytest.raises(error, match=expected.replace("(", r"\(")):
    compressive.load(str(workdir))


# -- A finished run's record never changes. ------------------------------------------


@pytest.mark.slow  # trains (two steps)
def test_a_finished_run_keeps_its_config_json_when_run_again_with_other_values(tmp_path, caplog):
  from compressive.training import loop as train_lib
  from helpers import to_train

  workdir = str(tmp_path / "wd")
  config = tiny_experiment(num_train_steps=2, checkpoint_every_steps=2, eval_every_steps=0)
  train_lib.train_and_evaluate(to_train(config), workdir)
  recorded = (tmp_path / "wd" / "config.json").read_bytes()
  # The issue's: trained nothing, exit 0, and config.json then held 0.5.
  for changed in ({"optimizer.learning_rate": 0.5}, {"num_train_steps": 1}, {"log_every_steps": 7}):
    fields = {"num_train_steps": 2, "checkpoint_every_steps": 2, "eval_every_steps": 0, **changed}
    assert train_lib.train_and_evaluate(to_train(tiny_experiment(**fields)), workdir) == {}
    assert (tmp_path / "wd" / "config.json").read_bytes() == recorded, changed
  assert (
    "this command's config differs from the finished run's (optimizer.learning_rate "
    "0.002 -> 0.5)" in caplog.text
  )
  # A record set aside as damaged is written again, from the run's own values.
  (tmp_path / "wd" / "config.json").write_text("{ damaged")
  train_lib.train_and_evaluate(to_train(config), workdir)
  assert (tmp_path / "wd" / "config.json").read_bytes() == recorded
  assert (tmp_path / "wd" / "config.json.damaged").exists()
