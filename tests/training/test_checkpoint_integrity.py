"""Checkpoints say what happened to them: checksummed arrays, finite state,
and restore errors that tell a missing step, another model and real damage
apart; --restore_intact never trains over checkpoints it skipped."""

import json
import os
import re
import shutil

from flax import nnx
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import compressive
from compressive import config as config_lib
from compressive.errors import CheckpointError, NonFiniteError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import integrity, runconfig, trees
from compressive.training import loop as train_lib
from compressive.training import step as train_step
from helpers import checked, run_identity_of, tiny_experiment, to_train, tree_digest


def config(**overrides):
  values = {
    "num_train_steps": 6,
    "checkpoint_every_steps": 2,
    "eval_every_steps": 0,
    "keep_checkpoints": 3,
  }
  values.update(overrides)
  return tiny_experiment(**values)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A workdir with checkpoints 2, 4 and 6 (copied before each test changes it)."""
  workdir = tmp_path_factory.mktemp("trained") / "wd"
  train_lib.train_and_evaluate(to_train(config()), str(workdir))
  return workdir


@pytest.fixture
def workdir(trained, tmp_path):
  target = tmp_path / "wd"
  shutil.copytree(trained, target)
  return target


def params_of(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def flip_bytes(step_dir, fraction, count=8):
  """XORs `count` bytes at `fraction` of the largest data file of a
  checkpoint's state, as a bad disk or a stray write would."""
  files = [
    os.path.join(root, name)
    for root, _, names in os.walk(step_dir / "state")
    for name in names
    if os.sep + "d" + os.sep in os.path.join(root, name)
  ]
  path = max(files, key=os.path.getsize)
  with open(path, "rb") as f:
    data = bytearray(f.read())
  at = int(len(data) * fraction)
  data[at : at + count] = bytes(b ^ 0x5A for b in data[at : at + count])
  with open(path, "wb") as f:
    f.write(data)


def abstract_state():
  experiment = config_lib.check(config())
  params = train_step.abstract_model(experiment)[2]
  return train_step.abstract_train_state(
    experiment.train, params, train_step.make_optimizer(experiment.train, params)
  )


def orbax_alone(step_dir):
  """What Orbax itself restores, with no checks of ours: the arrays' bytes."""
  state = ocp.StandardCheckpointer().restore(
    str(step_dir / "state"), trees.abstract(abstract_state())
  )
  return [np.asarray(x) for x in jax.tree.leaves(state)]


@pytest.mark.slow
def test_flipped_bytes_are_named_never_restored(trained, tmp_path):
  # Eight bytes XORed at five places of the data, one place per copy. Most
  # such damage decodes without complaint (the compressed data files carry no
  # checksums of their own), and Orbax alone hands back other numbers; our
  # restore must name every one of them as damage.
  silent = 0
  for i, fraction in enumerate((0.2, 0.35, 0.5, 0.65, 0.8)):
    workdir = tmp_path / f"wd{i}"
    shutil.copytree(trained, workdir)
    step_dir = workdir / "checkpoints" / "6"
    before = orbax_alone(step_dir)
    flip_bytes(step_dir, fraction)
    try:
      after = orbax_alone(step_dir)
      silent += any((x != y).any() for x, y in zip(before, after))
    except Exception:
      pass  # this one the decoder notices
    with pytest.raises(integrity.DamagedCheckpointError, match=r"checkpoints/6 is damaged"):
      compressive.load(str(workdir))
    compressive.load(str(workdir), 4)  # the older ones are intact
  assert silent >= 1


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_stops_the_resume_and_restore_intact_skips_it(
  workdir, trained, tmp_path
):
  flip_bytes(workdir / "checkpoints" / "6", 0.5)
  longer = config(num_train_steps=8)
  with pytest.raises(
    integrity.DamagedCheckpointError, match="checkpoints/6 is damaged.*--restore_intact"
  ):
    train_lib.train_and_evaluate(to_train(longer), str(workdir))
  # --restore_intact resumes from step 4, and the damaged step is kept aside
  # (rotation would otherwise delete it as the oldest).
  train_lib.train_and_evaluate(to_train(longer), str(workdir), restore_intact=True)
  assert sorted(os.listdir(workdir / "checkpoints" / "skipped")) == ["6"]
  straight = tmp_path / "straight"  # as if step 6 had never been saved
  shutil.copytree(trained, straight)
  shutil.rmtree(straight / "checkpoints" / "6")
  train_lib.train_and_evaluate(to_train(longer), str(straight))
  a, b = params_of(compressive.load(str(workdir))[1]), params_of(compressive.load(str(straight))[1])
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_a_missing_step_is_named_with_the_saved_ones(workdir):
  with pytest.raises(
    ckpt_lib.MissingStepError, match=r"no checkpoint of step 5 in .*; saved steps are \[2, 4, 6\]"
  ) as info:
    compressive.load(str(workdir), 5)
  assert "restore_intact" not in str(info.value) and "damaged" not in str(info.value)


@pytest.mark.slow
def test_another_model_is_a_shape_mismatch_and_restore_intact_keeps_every_checkpoint(workdir):
  # config.json says d_model 16 (as if the checkpoints had been copied into
  # another run's workdir): the resume check passes, the shapes do not.
  narrow = config(**{"model.d_model": 16, "model.d_ff": 32, "num_train_steps": 8})
  runconfig.save_config(str(workdir), checked(narrow))
  before = tree_digest(workdir / "checkpoints")
  for intact in (False, True):
    with pytest.raises(ckpt_lib.ShapeMismatchError) as info:
      train_lib.train_and_evaluate(to_train(narrow), str(workdir), restore_intact=intact)
    message = str(info.value)
    assert "parameter shapes differ" in message and "restore_intact" not in message
    assert re.search(
      r"\(\d+ of \d+ have other shapes, saved -> config: "
      r"blocks/0/\S+ \([\d, ]+\) -> \([\d, ]+\)",
      message,
    )
  assert tree_digest(workdir / "checkpoints") == before  # nothing skipped, deleted or trained


@pytest.mark.slow
def test_restore_intact_stops_when_no_checkpoint_restores(workdir):
  for step in (2, 4, 6):
    for root, _, files in os.walk(workdir / "checkpoints" / str(step) / "state"):
      for name in files:
        open(os.path.join(root, name), "wb").close()
  with pytest.raises(
    CheckpointError,
    match=r"no checkpoint in .* restores: steps \[6, 4, 2\] are damaged"
    r".*nothing was trained",
  ):
    train_lib.train_and_evaluate(
      to_train(config(num_train_steps=8)), str(workdir), restore_intact=True
    )
  assert sorted(os.listdir(workdir / "checkpoints" / "skipped")) == ["2", "4", "6"]
  assert not os.path.exists(workdir / "checkpoints" / "8")


@pytest.mark.slow
def test_a_reader_that_loses_a_race_with_rotation_reads_the_newest(workdir, monkeypatch):
  # While the reader restores step 6, a trainer rotates it away (keeping 4
  # in this simulation): the reader retries with the newest step that exists.
  real = ckpt_lib.Checkpointer.restore
  calls = []

  def racing(self, step, *args, **kwargs):
    calls.append(step)
    if len(calls) == 1:
      shutil.rmtree(self.step_dir(step))
    return real(self, step, *args, **kwargs)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "restore", racing)
  compressive.load(str(workdir))
  assert calls == [6, 4]


@pytest.mark.slow
def test_a_non_finite_state_is_never_saved_and_the_stop_names_the_newest_intact(
  tmp_path, monkeypatch
):
  # Step 4's state holds a NaN (as a silent overflow would leave it) while
  # its loss is finite: the save refuses it, and the stop names step 2, the
  # newest checkpoint that verifies (a NaN-holding step 4 was once saved, and
  # every reader then called it damaged).
  real = ckpt_lib.Checkpointer.save

  def poisoned(self, step, state, *rest):
    if step == 4:
      state = state.replace(
        params=jax.tree.map(lambda p: p.at[(0,) * p.ndim].set(np.nan), state.params)
      )
    return real(self, step, state, *rest)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", poisoned)
  with pytest.raises(
    NonFiniteError, match="at step 4 .* not saved; the newest intact checkpoint is step 2"
  ):
    train_lib.train_and_evaluate(to_train(config()), str(tmp_path))
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "workdir.json"]


def test_the_fingerprint_is_the_same_on_any_layout_and_sees_one_bit():
  x = jax.random.normal(jax.random.PRNGKey(0), (64, 48))
  a = integrity.fingerprint({"x": x})
  assert a == integrity.fingerprint({"x": np.asarray(x)})
  bits = np.asarray(x).view(np.uint32).copy()
  bits[17, 3] ^= 1 << 9
  b = integrity.fingerprint({"x": bits.view(np.float32)})
  assert a["sums"]["x"] != b["sums"]["x"]
  # Two swapped values keep the plain sum but not the position-weighted one.
  swapped = np.asarray(x).copy()
  swapped[[0, 1]] = swapped[[1, 0]]
  c = integrity.fingerprint({"x": swapped})
  assert c["sums"]["x"][0] == a["sums"]["x"][0] and c["sums"]["x"][1] != a["sums"]["x"][1]
  assert integrity.fingerprint({"x": x.at[0, 0].set(np.inf)})["nonfinite"] == ["x"]
  assert json.loads(json.dumps(a)) == a  # stored as JSON beside the arrays


def test_a_checkpoint_from_before_a_memory_field_existed_restores_it_empty(tmp_path):
  # Checkpoints written before the memory counted `visits` still resume:
  # the saved fields come back, the new one starts empty.
  from helpers import tiny_model_config

  memory = compressive.init_memory(tiny_model_config(), 2)
  memory = jax.tree.map(lambda x: x + np.ones_like(x), memory)  # nothing empty
  state = {"w": np.arange(3.0, dtype=np.float32)}
  old = {k: v for k, v in trees.nonempty_fields(memory).items() if k != "visits"}
  saver = ckpt_lib.Checkpointer(str(tmp_path))
  saver.save(1, state, old, {"position": np.zeros(2, np.int64)}, run_identity_of())
  saver.close()
  reader = ckpt_lib.Checkpointer(str(tmp_path), read_only=True)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), memory)
  _, restored, _ = reader.restore(1, trees.abstract(state), abstract)
  for name in ("mem", "mem_mask", "cmem", "cmem_mask", "usage"):
    np.testing.assert_array_equal(getattr(restored, name), getattr(memory, name), err_msg=name)
  np.testing.assert_array_equal(restored.visits, np.zeros_like(memory.visits))
