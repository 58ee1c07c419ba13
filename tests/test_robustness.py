"""Nothing lost: kills, signals, NaNs and corrupt checkpoints (in-process and
as a user runs train.py)."""

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from flax import nnx
import jax
import numpy as np
import pytest

import compressive
from compressive import checkpoint as ckpt_lib
from compressive import train_lib
from compressive.errors import CheckpointError, ConfigError
from test_train import tiny_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 24


def params_of(workdir):
  _, model = compressive.load(str(workdir))
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def assert_same_params(a, b):
  for x, y in zip(params_of(a), params_of(b)):
    np.testing.assert_array_equal(x, y)


def tree_digest(path):
  h = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(path)):
    dirs.sort()
    for name in sorted(files):
      p = os.path.join(root, name)
      h.update(p.encode())
      with open(p, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("cfg") / "robust.py"
  path.write_text(textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
      from test_train import tiny_experiment

      def get_config():
        return tiny_experiment(**{{"num_train_steps": {STEPS}, "checkpoint_every_steps": 2,
                                   "log_every_steps": 3, "eval_every_steps": 0,
                                   "model.dropout_rate": 0.1}})
      """))
  return str(path)


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  # The many train.py processes below share compiled programs (JAX's own
  # persistent cache), so that each spends its time training, not compiling.
  global ENV
  ENV = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax_cache")))


ENV = None


def train(config_file, workdir, *extra):
  return subprocess.Popen(
      [sys.executable, "train.py", f"--config={config_file}", f"--workdir={workdir}", *extra],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


@pytest.fixture(scope="module")
def reference(config_file, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("reference") / "wd"
  p = train(config_file, workdir)
  out, err = p.communicate(timeout=600)
  assert p.returncode == 0, err[-3000:]
  return workdir


def wait_for_step(proc, step, timeout=300):
  """Reads stderr until the log line of `step` (the process keeps running)."""
  deadline = time.time() + timeout
  for line in proc.stderr:
    if f"step {step}/" in line:
      return
    if time.time() > deadline:
      break
  raise AssertionError(f"no log line for step {step}")


def test_sigterm_checkpoints_exits_0_and_resumes_identically(config_file, reference, tmp_path):
  workdir = tmp_path / "wd"
  p = train(config_file, workdir)
  wait_for_step(p, 6)
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=300)
  assert p.returncode == 0, err[-3000:]
  stopped = ckpt_lib.Checkpointer(str(workdir), read_only=True).latest_step()
  assert 6 <= stopped < STEPS
  p = train(config_file, workdir)
  _, err = p.communicate(timeout=600)
  assert p.returncode == 0 and f"resumed from step {stopped}" in err, err[-3000:]
  assert_same_params(workdir, reference)


def test_sigkill_at_random_moments_loses_nothing(config_file, reference, tmp_path):
  # Ten runs killed at random moments (during start-up, steps or saves),
  # two at a time; each is resumed to the end and must match the reference.
  rng = random.Random(0)
  runs = [tmp_path / f"run{i}" for i in range(10)]
  for pair in (runs[i:i + 2] for i in range(0, len(runs), 2)):
    procs = [train(config_file, wd) for wd in pair]
    for proc in procs:
      time.sleep(rng.uniform(3.0, 12.0))
      proc.kill()
      proc.communicate()
    procs = [train(config_file, wd) for wd in pair]
    for proc in procs:
      _, err = proc.communicate(timeout=600)
      assert proc.returncode == 0, err[-3000:]
  for wd in runs:
    assert_same_params(wd, reference)


def inject_nan_at(monkeypatch, bad_step):
  """Makes the real train step see NaN parameters at `bad_step`."""
  make = train_lib.make_train_step

  def patched(*args, **kwargs):
    step_fn = make(*args, **kwargs)
    calls = {"n": 0}

    def wrapped(state, memory, batch):
      calls["n"] += 1
      if calls["n"] == bad_step:
        state = state.replace(params=jax.tree.map(lambda p: p * np.float32("nan"), state.params))
      return step_fn(state, memory, batch)
    return wrapped

  monkeypatch.setattr(train_lib, "make_train_step", patched)


def test_non_finite_loss_stops_without_saving_it(tmp_path, monkeypatch):
  config = tiny_experiment(**{"checkpoint_every_steps": 2, "eval_every_steps": 0})
  inject_nan_at(monkeypatch, 5)
  with pytest.raises(train_lib.NonFiniteError, match="at step 5; the last good checkpoint"):
    train_lib.train_and_evaluate(config, str(tmp_path))
  assert ckpt_lib.Checkpointer(str(tmp_path), read_only=True).latest_step() == 4
  assert all(np.isfinite(p).all() for p in params_of(tmp_path))


def test_corrupt_newest_checkpoint_is_named_and_intact_one_resumes(tmp_path):
  config = tiny_experiment(**{"num_train_steps": 9, "checkpoint_every_steps": 3,
                              "eval_every_steps": 0})
  straight = tmp_path / "straight"
  train_lib.train_and_evaluate(config, str(straight))
  broken = tmp_path / "broken"
  train_lib.train_and_evaluate(config, str(broken), stop_at_step=6)
  # Truncate every file of the newest checkpoint's state.
  newest = broken / "checkpoints" / "6" / "state"
  for root, _, files in os.walk(newest):
    for name in files:
      open(os.path.join(root, name), "wb").close()
  with pytest.raises(CheckpointError, match=r"checkpoints/6 cannot be restored.*--restore_intact"):
    train_lib.train_and_evaluate(config, str(broken))
  train_lib.train_and_evaluate(config, str(broken), restore_intact=True)
  assert_same_params(broken, straight)


def test_resuming_with_other_shapes_names_the_fields(tmp_path):
  config = tiny_experiment(**{"num_train_steps": 3})
  train_lib.train_and_evaluate(config, str(tmp_path))
  other = tiny_experiment(**{"num_train_steps": 6, "model.d_model": 16, "batch_size": 2})
  with pytest.raises(ConfigError) as info:
    train_lib.train_and_evaluate(other, str(tmp_path))
  assert "model.d_model 32 -> 16" in str(info.value) and "batch_size 4 -> 2" in str(info.value)
  assert ckpt_lib.load_config(str(tmp_path)).model.d_model == 32  # the saved config is kept


def test_evaluation_never_modifies_checkpoints(reference):
  before = tree_digest(reference / "checkpoints")
  r = subprocess.run([sys.executable, "eval.py", f"--workdir={reference}", "--split=validation",
                      "--max_segments=2"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                     env=ENV)
  assert r.returncode == 0, r.stderr[-3000:]
  compressive.load(str(reference))
  assert tree_digest(reference / "checkpoints") == before
