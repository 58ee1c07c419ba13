"""TensorBoard output without TensorFlow. One tiny training run, in a process
where TensorFlow, TFDS and TensorBoard cannot be imported, succeeds; its event
files, read back with TensorBoard's own reader, hold the scalars of its jsonl
files, and its config reaches TensorBoard's HParams plugin as hparams."""

import os
import sys
import textwrap

import ml_collections
import numpy as np
import pytest

from compressive import nested
from compressive.training.metrics import MetricWriter, read_jsonl
from compressive.training.writers import hparam_value, hparams
from helpers import ROOT, TESTS, checked, tiny_experiment
import processes

# 12 steps, logged every 2, evaluated at 6 and 12; one checkpoint at the end.
OVERRIDES = {"checkpoint_every_steps": 0}
TRAIN_SCALARS = {
  "loss",
  "bits_per_byte",
  "reconstruction_loss",
  "grad_norm",
  "learning_rate",
  "tokens_per_second",
}

TRAIN_WITHOUT_TENSORFLOW = textwrap.dedent("""
    import sys

    # As if not installed: `import tensorflow` raises ModuleNotFoundError and
    # importlib.util.find_spec("tensorflow") is None (etils asks that).
    BLOCKED = ("tensorflow", "tensorflow_datasets", "tensorboard")

    class Hide:
      def __init__(self, finder):
        self.finder = finder

      def find_spec(self, name, path=None, target=None):
        find_spec = getattr(self.finder, "find_spec", None)
        if find_spec is None or name.split(".")[0] in BLOCKED:
          return None
        return find_spec(name, path, target)

      def __getattr__(self, attr):
        return getattr(self.finder, attr)

    sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
    sys.path[:0] = [ROOT, TESTS]
    from helpers import tiny_experiment, to_train
    from compressive import cli
    from compressive.training import loop as train_lib
    cli.use_compilation_cache(None)  # the session's, as the entry points find it
    train_lib.train_and_evaluate(to_train(tiny_experiment(**OVERRIDES)), WORKDIR)
    print("trained without tensorflow")
""")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  wd = tmp_path_factory.mktemp("metrics") / "wd"
  code = (
    f"ROOT = {ROOT!r}\nTESTS = {TESTS!r}\n"
    f"WORKDIR = {str(wd)!r}\nOVERRIDES = {OVERRIDES!r}\n" + TRAIN_WITHOUT_TENSORFLOW
  )
  result = processes.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  return result, wd


@pytest.mark.slow
def test_training_runs_without_tensorflow(trained):
  result, wd = trained
  assert result.returncode == 0, result.stderr[-4000:]
  assert "trained without tensorflow" in result.stdout
  for name in ("train", "eval"):
    files = os.listdir(wd / "tensorboard" / name)
    assert any(f.startswith("events.out.tfevents.") for f in files), (name, files)


@pytest.fixture
def workdir(trained):
  result, wd = trained
  if result.returncode != 0:
    pytest.fail("the training run failed: see test_training_runs_without_tensorflow")
  return wd


def _accumulator(path):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

  acc = EventAccumulator(str(path))
  acc.Reload()
  return acc


@pytest.mark.slow
@pytest.mark.parametrize("name", ["train", "eval"])
def test_event_files_hold_the_jsonl_scalars(workdir, name):
  rows = read_jsonl(str(workdir / f"metrics_{name}.jsonl"))
  assert len(rows) == (6 if name == "train" else 2)
  acc = _accumulator(workdir / "tensorboard" / name)
  tags = set(acc.Tags()["scalars"])
  assert tags == set(rows[0]) - {"step"}
  assert tags >= (TRAIN_SCALARS if name == "train" else {"loss", "bits_per_byte"})
  for tag in tags:
    # Event files hold float32.
    assert [(e.step, e.value) for e in acc.Scalars(tag)] == [
      (r["step"], float(np.float32(r[tag]))) for r in rows
    ], tag


def _hparams_plugin_session_groups(logdir):
  """What TensorBoard's HParams tab lists for `logdir`."""
  from tensorboard import context
  from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
  from tensorboard.plugins import base_plugin
  from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

  mux = plugin_event_multiplexer.EventMultiplexer()
  mux.AddRunsFromDirectory(str(logdir))
  mux.Reload()
  provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
  ctx = backend_context.Context(
    base_plugin.TBContext(logdir=str(logdir), data_provider=provider, multiplexer=mux)
  )
  request = api_pb2.ListSessionGroupsRequest(
    start_index=0, slice_size=100, allowed_statuses=api_pb2.Status.values()
  )
  handler = list_session_groups.Handler(context.RequestContext(), ctx, "", request)
  return handler.run().session_groups


def _hparams(group):
  return {k: getattr(v, v.WhichOneof("kind")) for k, v in group.hparams.items()}


@pytest.mark.slow
def test_training_writes_the_config_as_hparams(workdir):
  groups = _hparams_plugin_session_groups(workdir / "tensorboard")
  assert [g.name for g in groups] == ["train"]
  got = _hparams(groups[0])
  # Every field of every group, as config.json records it (Experiment.to_dict).
  recorded = checked(tiny_experiment(**OVERRIDES)).to_dict()
  assert got == {k: hparam_value(v) for k, v in nested.flatten(recorded).items()}
  assert got["eval.memory_length"] == tiny_experiment().model.memory_length  # -1 resolved
  assert got["model.d_model"] == 32 and got["data.source"] == "synthetic"
  assert got["data.synthetic.num_docs"] == "(16, 4, 4)"
  # The run's scalars are its metrics: the last logged value of each.
  last = read_jsonl(str(workdir / "metrics_train.jsonl"))[-1]
  metrics = {m.name.tag: (m.training_step, m.value) for m in groups[0].metric_values}
  assert metrics["loss"] == (last["step"], float(np.float32(last["loss"])))
  assert set(metrics) == set(last) - {"step"}


def test_tensorboard_shows_the_first_hparams_of_a_run_directory(tmp_path):
  for lr in (0.1, 0.2):  # a run, then its resumption (within the same second)
    writer = MetricWriter(str(tmp_path), "train")
    writer.write_hparams({"optimizer.learning_rate": lr, "model.sizes": (1, 2), "x": None})
    writer.write(int(lr * 10), {"loss": lr})
    writer.close()
  assert len(os.listdir(tmp_path / "tensorboard" / "train")) == 2  # neither file overwritten
  groups = _hparams_plugin_session_groups(tmp_path / "tensorboard")
  assert [_hparams(g) for g in groups] == [
    {"optimizer.learning_rate": 0.1, "model.sizes": "(1, 2)", "x": "None"}
  ]
  acc = _accumulator(tmp_path / "tensorboard" / "train")
  assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
    (1, float(np.float32(0.1))),
    (2, float(np.float32(0.2))),
  ]


def test_flatten_and_hparam_values():
  c = ml_collections.ConfigDict(
    {
      "a": 1,
      "b": {"c": (2, 3), "d": None, "e": {"f": "x"}},
      "g": [1.5],
      "h": True,
      "i": np.float32(0.5),
    }
  )
  flat = nested.flatten(c)
  assert flat == {
    "a": 1,
    "b.c": (2, 3),
    "b.d": None,
    "b.e.f": "x",
    "g": [1.5],
    "h": True,
    "i": np.float32(0.5),
  }
  assert nested.flatten(flat) == flat
  assert {k: hparam_value(v) for k, v in flat.items()} == {
    "a": 1,
    "b.c": "(2, 3)",
    "b.d": "None",
    "b.e.f": "x",
    "g": "[1.5]",
    "h": True,
    "i": 0.5,
  }


def test_disabled_writer_writes_nothing(tmp_path):
  w = MetricWriter(str(tmp_path), "train", enabled=False)
  w.write(1, {"loss": 1.0})
  w.write_hparams({"a": 1})
  w.close()
  assert os.listdir(tmp_path) == []


def test_the_hparams_are_the_config_flattened_once():
  # One function (writers.hparams) for the hparams a run logs: a numpy
  # scalar, a tuple and None come out as TensorBoard takes them, from the
  # nested config or from one already flat.
  c = ml_collections.ConfigDict(
    {"a": {"b": np.float32(0.5), "c": (1, 2)}, "d": None, "e": {}, "f": True}
  )
  assert hparams(c) == {"a.b": 0.5, "a.c": "(1, 2)", "d": "None", "f": True}
  assert hparams(hparams(c)) == hparams(c) == hparams(nested.flatten(c))
