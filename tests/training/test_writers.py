"""Metric writers (compressive/training/writers.py): TensorBoard by default,
Weights & Biases as an optional one (run here in W&B's offline mode: no
account, no network), and a user's own writer registered by name or named
`module:Name`, each given the config once and every record of both streams."""

import glob
import json
import os
import struct
import sys
import textwrap

import pytest

from compressive.errors import ConfigError
from compressive.training import loop as train_lib
from compressive.training import writers
from compressive.training.metrics import read_jsonl
from helpers import tiny_experiment, to_train
import inprocess

RUN = {
  "num_train_steps": 4,
  "log_every_steps": 1,
  "eval_every_steps": 2,
  "checkpoint_every_steps": 2,
}


class Recorder:
  """A writer of the test's own: what it is told, in order."""

  told: list = []

  def __init__(self, run):
    Recorder.told.append(("open", run.name, run.config["model"]["d_model"]))

  def write(self, stream, step, scalars):
    Recorder.told.append((stream, step, sorted(scalars)))

  def write_hparams(self, config):
    Recorder.told.append(("hparams", config["batch_size"]))

  def close(self):
    Recorder.told.append(("close",))


@pytest.mark.slow
def test_a_writer_of_your_own_registers_by_name_and_is_told_every_record(tmp_path):
  writers.register("recorder", Recorder)
  Recorder.told = []
  try:
    config = tiny_experiment(**RUN, metric_writers=("recorder",))
    train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"), stop_at_step=2)
  finally:
    writers.unregister("recorder")
  told = Recorder.told
  assert told[0] == ("open", "wd", 32) and told[1] == ("hparams", 4) and told[-1] == ("close",)
  records = [t for t in told[2:-1]]
  train = read_jsonl(str(tmp_path / "wd" / "metrics_train.jsonl"))
  evals = read_jsonl(str(tmp_path / "wd" / "metrics_eval.jsonl"))
  assert [t[:2] for t in records] == [("train", 1), ("train", 2), ("eval", 2)]
  assert records[0][2] == sorted(set(train[0]) - {"step"})
  assert records[2][2] == sorted(set(evals[0]) - {"step"})
  # No TensorBoard unless it is named.
  assert not os.path.exists(tmp_path / "wd" / "tensorboard")


PLUGIN = textwrap.dedent('''
    import json

    class FileWriter:
      """Writes each record as a JSON line in the workdir."""

      def __init__(self, run):
        self.path = run.workdir + "/my_writer.jsonl"

      def write(self, stream, step, scalars):
        with open(self.path, "a") as f:
          f.write(json.dumps({"stream": stream, "step": step, **scalars}) + "\\n")

      def write_hparams(self, config):
        pass

      def close(self):
        pass
    ''')


@pytest.mark.slow
def test_a_writer_named_module_colon_name_is_imported_on_demand(tmp_path, monkeypatch):
  (tmp_path / "my_writers.py").write_text(PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  config = tiny_experiment(**RUN, metric_writers=("tensorboard", "my_writers:FileWriter"))
  workdir = tmp_path / "wd"
  train_lib.train_and_evaluate(to_train(config), str(workdir), stop_at_step=2)
  lines = [json.loads(line) for line in (workdir / "my_writer.jsonl").read_text().splitlines()]
  assert [(r["stream"], r["step"]) for r in lines] == [("train", 1), ("train", 2), ("eval", 2)]
  assert os.listdir(workdir / "tensorboard" / "train")  # and TensorBoard beside it
  sys.modules.pop("my_writers", None)


@pytest.mark.parametrize(
  "names,said",
  [
    (("nope",), "metric_writers='nope' is unknown; choose one of tensorboard, wandb"),
    (
      ("no_such_module:W",),
      "metric_writers='no_such_module:W': cannot import module 'no_such_module'",
    ),
    (("json:nothing",), "metric_writers='json:nothing': module 'json' has no 'nothing'"),
    (("tensorboard", "tensorboard"), "must be a tuple of distinct writer names"),
    (("",), "must be a tuple of distinct writer names"),
  ],
)
def test_a_writer_that_cannot_be_had_is_one_line_before_anything(tmp_path, names, said):
  with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
    experiment = to_train(tiny_experiment(**RUN, metric_writers=names))
    train_lib.train_and_evaluate(experiment, str(tmp_path / "wd"))
  assert not os.path.exists(tmp_path / "wd")


def test_wandb_not_installed_is_one_line_naming_the_extra(tmp_path, monkeypatch):
  import importlib.util

  find = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find(name, *a)
  )
  r = inprocess.run(
    "train.py",
    [f"--workdir={tmp_path}/wd", "--config.metric_writers=(tensorboard,wandb)", "--dry_run"],
  )
  assert r.returncode == 2 and r.stderr.strip() == (
    "error: metric_writers names wandb, which needs the wandb package: pip install "
    '"compressive[wandb]" (or pip install wandb)'
  ), r.stderr


# -- Weights & Biases, offline. -------------------------------------------------


def wandb_records(path):
  """The records of a W&B run file (run-<id>.wandb): LevelDB-style log
  blocks of 32 KiB after a 7-byte header, each record's chunks (full, or
  first/middle/last) holding one protobuf Record."""
  from wandb.proto import wandb_internal_pb2 as pb

  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  records, pos, pending, block = [], 7, b"", 32768
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a header: padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    pending += data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # full, last
      record = pb.Record()
      record.ParseFromString(pending)
      records.append(record)
      pending = b""
  return records


@pytest.mark.slow
def test_a_wandb_offline_run_holds_the_config_and_the_logged_steps(tmp_path, monkeypatch):
  for name in [n for n in os.environ if n.startswith("WANDB_")]:
    monkeypatch.delenv(name)
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
  monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
  config = tiny_experiment(**RUN, metric_writers=("tensorboard", "wandb"))
  workdir = tmp_path / "my_run"
  experiment = to_train(config)
  train_lib.train_and_evaluate(experiment, str(workdir), stop_at_step=2)
  train_lib.train_and_evaluate(experiment, str(workdir))  # resumed: the same W&B run
  paths = sorted(glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb")))
  assert len(paths) == 2 and len({os.path.basename(p) for p in paths}) == 1, paths
  records = [r for path in paths for r in wandb_records(path)]
  run = [r.run for r in records if r.WhichOneof("record_type") == "run"][0]
  assert run.display_name == "my_run" and run.project == "compressive"
  recorded = {item.key: json.loads(item.value_json) for item in run.config.update}
  want = json.loads(json.dumps(experiment.to_dict()))
  assert {k: recorded[k] for k in want} == want  # the config, every field
  history = []
  for r in records:
    if r.WhichOneof("record_type") == "history":
      items = {
        i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item
      }
      history.append((r.history.step.num, items))
  train = read_jsonl(str(workdir / "metrics_train.jsonl"))
  evals = read_jsonl(str(workdir / "metrics_eval.jsonl"))
  logged = {
    (step, key.split("/")[0]): None for step, items in history for key in items if "/" in key
  }
  assert sorted(logged) == sorted(
    [(r["step"], "train") for r in train] + [(r["step"], "eval") for r in evals]
  )
  for step, items in history:
    for r in train:
      if r["step"] == step and "train/loss" in items:
        assert items["train/loss"] == pytest.approx(r["loss"])
  assert all(os.path.basename(p) == f"run-{run.run_id}.wandb" for p in paths)
