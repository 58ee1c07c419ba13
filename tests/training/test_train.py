"""Training end to end on a tiny config: it learns, resumes bit-exactly, and
`compressive.load` gives the trained model back."""

import logging

import numpy as np
import pytest

from compressive.training import loop as train_lib
from compressive.training.metrics import read_jsonl
from helpers import assert_resumed_like_straight, tiny_experiment, to_train

# Slow (every test trains end to end with train_and_evaluate):
# `make test-fast` (pytest -m 'not slow') leaves this file out.
pytestmark = pytest.mark.slow


def test_resume_is_bit_identical(tmp_path):
  config = tiny_experiment(**{"model.dropout_rate": 0.1})
  straight = tmp_path / "straight"
  resumed = tmp_path / "resumed"
  train_lib.train_and_evaluate(to_train(config), str(straight))
  train_lib.train_and_evaluate(to_train(config), str(resumed), stop_at_step=7)  # checkpoint at 7
  from compressive.training import checkpoint

  assert checkpoint.Checkpointer(str(resumed)).latest_step() == 7
  train_lib.train_and_evaluate(to_train(config), str(resumed))

  assert_resumed_like_straight(straight, resumed, straddling_step=8)


def test_training_reduces_the_loss_that_evaluation_measures(tmp_path):
  # 16 training documents of period-12 copies: a tiny model memorises them in
  # 60 steps, and evaluation on the same split must see it.
  config = tiny_experiment(
    **{
      "num_train_steps": 60,
      "eval_every_steps": 0,
      "optimizer.learning_rate": 3e-3,
      "eval.split": "train",
    }
  )
  result = train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"))
  first = read_jsonl(str(tmp_path / "wd" / "metrics_train.jsonl"))[0]
  assert result["bits_per_byte"] < 0.6 * first["bits_per_byte"]
  assert set(result) >= {"loss", "bits_per_byte", "bits_per_token"}


@pytest.mark.parametrize("memory,compressed", [(8, 0), (0, 0)], ids=["transformer_xl", "local"])
def test_models_without_a_memory_bank_checkpoint_and_resume(tmp_path, memory, compressed):
  # Their memory has zero-size fields, which Orbax will not save by itself.
  config = tiny_experiment(
    **{
      "model.memory_length": memory,
      "model.compressed_memory_length": compressed,
      "model.reconstruction_loss": "none",
      "num_train_steps": 4,
      "checkpoint_every_steps": 2,
      "eval_every_steps": 0,
    }
  )
  train_lib.train_and_evaluate(to_train(config), str(tmp_path), stop_at_step=2)
  from compressive.training import checkpoint

  assert checkpoint.Checkpointer(str(tmp_path)).latest_step() == 2
  train_lib.train_and_evaluate(to_train(config), str(tmp_path))
  assert checkpoint.Checkpointer(str(tmp_path)).latest_step() == 4
  assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics_train.jsonl"))] == [2, 4]


@pytest.mark.parametrize("positions", ["relative", "rope"])
def test_logged_metrics_are_finite_and_attention_mass_only_when_computed(
  tmp_path, positions, caplog
):
  # Fused rope attention computes no weights (the model reports NaN mass);
  # training logs and writes no NaN, and leaves those scalars out.
  config = tiny_experiment(
    **{"num_train_steps": 2, "eval_every_steps": 0, "model.positions": positions}
  )
  with caplog.at_level(logging.INFO, logger="compressive"):
    train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"))
  rows = read_jsonl(str(tmp_path / "wd" / "metrics_train.jsonl"))
  assert rows and all(np.isfinite(v) for row in rows for v in row.values())
  mass = [k for k in rows[-1] if k.startswith("attention_mass/")]
  step_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
  if positions == "rope":
    assert mass == [] and all("attn c/m/s n/a" in line for line in step_lines)
  else:
    assert len(mass) == 3 and abs(sum(rows[-1][k] for k in mass) - 1.0) < 1e-3
  assert step_lines and not any("nan" in line for line in step_lines)
