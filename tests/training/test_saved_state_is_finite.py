"""Nothing non-finite is ever saved: a save checks the parameters, optimizer
state and memory it writes (the integrity record's own finiteness flags), not
only the step's loss and gradient norm, so a bad config is reported as one,
never as a damaged checkpoint later."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from compressive.errors import NonFiniteError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import loop as train_lib
from helpers import inject_nan_at, run_identity_of, tiny_experiment, to_train


def _data_state():
  return {"position": np.zeros((2,), np.int64)}


@pytest.mark.parametrize("where, bad", [("state", np.inf), ("state", np.nan), ("memory", -np.inf)])
def test_a_save_of_non_finite_arrays_is_refused_and_writes_nothing(tmp_path, bad, where):
  good = {"w": jnp.ones((3, 4), jnp.float32), "count": jnp.int32(1)}
  poisoned = {"w": jnp.ones((3, 4), jnp.float32).at[1, 2].set(bad), "count": jnp.int32(1)}
  checkpointer = ckpt_lib.Checkpointer(str(tmp_path))
  checkpointer.save(1, good, {"m": jnp.zeros((2, 2))}, _data_state(), run_identity_of())
  checkpointer.wait()
  state, memory = (
    (poisoned, {"m": jnp.zeros((2, 2))})
    if where == "state"
    else (good, {"m": jnp.zeros((2, 2)).at[0, 0].set(bad)})
  )
  with pytest.raises(
    NonFiniteError, match=r"step 2 was not saved: 1 array\(s\) .*not finite \(" + where
  ) as raised:
    checkpointer.save(2, state, memory, _data_state(), run_identity_of())
  assert isinstance(raised.value, ckpt_lib.NonFiniteStateError)
  checkpointer.close()
  assert ckpt_lib.Checkpointer(str(tmp_path), read_only=True).all_steps() == [1]
  assert not [n for n in os.listdir(tmp_path / "checkpoints") if "tmp" in n]


@pytest.mark.slow
def test_finite_loss_with_non_finite_parameters_stops_at_the_save_and_keeps_the_last(
  tmp_path, monkeypatch
):
  config = tiny_experiment(
    **{
      "checkpoint_every_steps": 2,
      "eval_every_steps": 0,
      "log_every_steps": 100,
      "num_train_steps": 6,
    }
  )
  # Its loss and gradient finite, its returned parameters inf.
  inject_nan_at(monkeypatch, 4, value=float("inf"), after=True)
  with pytest.raises(NonFiniteError) as raised:
    train_lib.train_and_evaluate(to_train(config), str(tmp_path))
  message = str(raised.value)
  assert message.startswith("non-finite parameters or optimizer state at step 4 (state/params/")
  assert (
    "though its loss and gradient were finite: not saved; the newest intact checkpoint is step 2"
    in message
    and "optimizer.learning_rate" in message
  )
  assert "\n" not in message
  assert ckpt_lib.Checkpointer(str(tmp_path), read_only=True).all_steps() == [2]
