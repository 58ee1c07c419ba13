"""Training end to end on a tiny config: it learns, resumes bit-exactly, and
`compressive.load` gives the trained model back."""

import logging
import os
import textwrap

import jax
import numpy as np
import pytest

import compressive
from compressive.training import loop as train_lib
from compressive.training.metrics import read_jsonl
from configs import default


def tiny_experiment(**overrides):
  c = default.get_config()
  c.data.source = "synthetic"
  c.data.synthetic.kind = "copy"
  c.data.synthetic.period = 12
  c.data.synthetic.num_docs = (16, 4, 4)
  c.data.synthetic.min_length = 40
  c.data.synthetic.max_length = 120
  m = c.model
  m.num_layers, m.d_model, m.d_ff, m.num_heads = 2, 32, 64, 2
  m.segment_length, m.memory_length, m.compressed_memory_length = 8, 8, 4
  c.batch_size = 4
  c.segments_per_step = 2
  c.num_train_steps = 12
  c.log_every_steps = 2
  c.eval_every_steps = 6
  c.checkpoint_every_steps = 3
  c.eval.max_segments = 4
  c.optimizer.warmup_steps = 2
  for k, v in overrides.items():
    target = c
    *path, last = k.split(".")
    for p in path:
      target = target[p]
    target[last] = v
  return c



def write_config_file(path, overrides=None, *, preamble="", factory="test_train:tiny_experiment"):
  """A config file for train.py and the other entry points (run in another
  process): `get_config()` returns `factory(**overrides)`, a function of a
  module in tests/. `preamble` is Python run first (e.g. to patch something)."""
  module, function = factory.split(":")
  tests = os.path.dirname(os.path.abspath(__file__))
  with open(path, "w") as f:
    f.write(f"import sys\nsys.path.insert(0, {tests!r})\nfrom {module} import {function}\n"
            f"{textwrap.dedent(preamble)}\n\n"
            f"def get_config():\n  return {function}(**{dict(overrides or {})!r})\n")
  return str(path)


def assert_resumed_like_straight(straight, resumed, straddling_step):
  """The resumed run logged what the uninterrupted one did, bit for bit,
  except the record whose log window straddles the restart, and ended with
  the same parameters. Returns the logged steps."""
  a = read_jsonl(str(straight / "metrics_train.jsonl"))
  b = read_jsonl(str(resumed / "metrics_train.jsonl"))
  assert [r["step"] for r in a] == [r["step"] for r in b]
  for ra, rb in zip(a, b):
    if ra["step"] == straddling_step:
      continue
    for k in ("loss", "reconstruction_loss", "grad_norm"):
      assert ra[k] == rb[k], (ra["step"], k)
  assert_same_parameters(straight, resumed)
  return [r["step"] for r in a]


def assert_same_parameters(workdir_a, workdir_b):
  """The two workdirs' latest models hold bit-identical parameters."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  _, a = compressive.load(str(workdir_a))
  _, b = compressive.load(str(workdir_b))
  for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

def test_resume_is_bit_identical(tmp_path):
  config = tiny_experiment(**{"model.dropout_rate": 0.1})
  straight = tmp_path / "straight"
  resumed = tmp_path / "resumed"
  train_lib.train_and_evaluate(config, str(straight))
  train_lib.train_and_evaluate(config, str(resumed), stop_at_step=7)  # checkpoint at 7
  from compressive.training import checkpoint
  assert checkpoint.Checkpointer(str(resumed)).latest_step() == 7
  train_lib.train_and_evaluate(config, str(resumed))

  assert_resumed_like_straight(straight, resumed, straddling_step=8)


def test_training_reduces_the_loss_that_evaluation_measures(tmp_path):
  # 16 training documents of period-12 copies: a tiny model memorises them in
  # 60 steps, and evaluation on the same split must see it.
  config = tiny_experiment(**{"num_train_steps": 60, "eval_every_steps": 0,
                              "optimizer.learning_rate": 3e-3, "eval.split": "train"})
  result = train_lib.train_and_evaluate(config, str(tmp_path / "wd"))
  first = read_jsonl(str(tmp_path / "wd" / "metrics_train.jsonl"))[0]
  assert result["bits_per_byte"] < 0.6 * first["bits_per_byte"]
  assert set(result) >= {"loss", "bits_per_byte", "bits_per_token"}


@pytest.mark.parametrize("memory,compressed", [(8, 0), (0, 0)], ids=["transformer_xl", "local"])
def test_models_without_a_memory_bank_checkpoint_and_resume(tmp_path, memory, compressed):
  # Their memory has zero-size fields, which Orbax will not save by itself.
  config = tiny_experiment(**{
      "model.memory_length": memory, "model.compressed_memory_length": compressed,
      "model.reconstruction_loss": "none", "num_train_steps": 4,
      "checkpoint_every_steps": 2, "eval_every_steps": 0})
  train_lib.train_and_evaluate(config, str(tmp_path), stop_at_step=2)
  from compressive.training import checkpoint
  assert checkpoint.Checkpointer(str(tmp_path)).latest_step() == 2
  train_lib.train_and_evaluate(config, str(tmp_path))
  assert checkpoint.Checkpointer(str(tmp_path)).latest_step() == 4
  assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics_train.jsonl"))] == [2, 4]


@pytest.mark.parametrize("positions", ["relative", "rope"])
def test_logged_metrics_are_finite_and_attention_mass_only_when_computed(tmp_path, positions, caplog):
  # Fused rope attention computes no weights (the model reports NaN mass);
  # training logs and writes no NaN, and leaves those scalars out.
  config = tiny_experiment(**{"num_train_steps": 2, "eval_every_steps": 0,
                              "model.positions": positions})
  with caplog.at_level(logging.INFO, logger="compressive"):
    train_lib.train_and_evaluate(config, str(tmp_path / "wd"))
  rows = read_jsonl(str(tmp_path / "wd" / "metrics_train.jsonl"))
  assert rows and all(np.isfinite(v) for row in rows for v in row.values())
  mass = [k for k in rows[-1] if k.startswith("attention_mass/")]
  step_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
  if positions == "rope":
    assert mass == [] and all("attn c/m/s n/a" in line for line in step_lines)
  else:
    assert len(mass) == 3 and abs(sum(rows[-1][k] for k in mass) - 1.0) < 1e-3
  assert step_lines and not any("nan" in line for line in step_lines)
