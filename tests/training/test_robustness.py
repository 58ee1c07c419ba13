"""Nothing lost: kills, signals, NaNs and corrupt checkpoints (in-process and
as a user runs train.py)."""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import compressive
from compressive.errors import CheckpointError, ConfigError, DataError, NonFiniteError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import loop as train_lib
from compressive.training import runconfig
from compressive.training import step as train_step
from helpers import (
  DEFAULT_LEVEL,
  ROOT,
  assert_same_params,
  inject_nan_at,
  params_of,
  process_env,
  run_identity_of,
  tiny_experiment,
  to_train,
  tree_digest,
  write_config_file,
)
import inprocess
import processes

STEPS = 24


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  return write_config_file(
    tmp_path_factory.mktemp("cfg") / "robust.py",
    {
      "num_train_steps": STEPS,
      "checkpoint_every_steps": 2,
      "log_every_steps": 3,
      "eval_every_steps": 0,
      "model.dropout_rate": 0.1,
    },
  )


# The many train.py processes below share compiled programs through the
# session's compilation cache (conftest.py), which they find in the
# environment they inherit, so that each spends its time training, not
# compiling; their programs are also those other modules' runs compiled.


def train(config_file, workdir, *extra, env=None):
  return processes.start(
    [sys.executable, "train.py", f"--config={config_file}", f"--workdir={workdir}", *extra],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
  )


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


def stop_by_sigterm_and_resume(config_file, workdir, env=None):
  """train.py stopped by SIGTERM after step 6 checkpoints and exits 143
  (128 + SIGTERM, as a shell reports it: a retry loop starts it again), a
  second train.py resumes from it to the end and exits 0."""
  p = train(config_file, workdir, env=env)
  wait_for_step(p, 6)
  p.send_signal(signal.SIGTERM)
  out, err = p.communicate(timeout=300)
  assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
  stopped = ckpt_lib.Checkpointer(str(workdir), read_only=True).latest_step()
  assert 6 <= stopped < STEPS
  assert err.strip().splitlines()[-1] == (
    f"error: stopped by SIGTERM after step {stopped} of {STEPS} (checkpointed); the same "
    "command resumes from there"
  ), err[-3000:]
  assert "final evaluation" not in out
  p = train(config_file, workdir, env=env)
  out, err = p.communicate(timeout=600)
  assert p.returncode == 0 and f"resumed from step {stopped}" in err, err[-3000:]
  assert "final evaluation" in out


@pytest.mark.slow
def test_sigterm_checkpoints_and_resumes_bit_identically_at_xlas_default_level(
  config_file, reference, tmp_path
):
  # The suite compiles with JAX's jax_disable_most_optimizations, XLA's
  # level 0 (conftest.py); users' runs compile at XLA's default level, whose
  # vectorised code rounds otherwise. A bit-identical resume is a promise
  # about users' runs, so it is held where they compute: a run stopped by
  # SIGTERM (its status 143, its checkpoint) and resumed ends with the
  # parameters of a straight run, both compiled at the default level. (At
  # level 0 the in-process resumes of training/test_train.py hold it, and
  # the kills below resume to the level-0 reference.)
  default = process_env(**DEFAULT_LEVEL)
  straight = train(config_file, tmp_path / "straight", env=default)  # beside the stopped one
  stop_by_sigterm_and_resume(config_file, tmp_path / "wd", env=default)
  _, err = straight.communicate(timeout=600)
  assert straight.returncode == 0, err[-3000:]
  assert_same_params(tmp_path / "wd", tmp_path / "straight")
  # The processes did compile at another level than the suite's (whose
  # reference run rounds otherwise), unless the suite runs at it too.
  if os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS") == "1":
    assert any(
      (a != b).any() for a, b in zip(params_of(tmp_path / "straight"), params_of(reference))
    ), (
      "the default-level run equals the suite's level-0 run bit for bit: it did not "
      "compile at the default level"
    )


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(config_file, reference, tmp_path):
  # Runs killed at moments spread over the length of a whole run (start-up,
  # steps and saves alike: a checkpoint every 2 of 24 steps), two at a time;
  # each is resumed to the end and must match the reference. Run i of RUNS
  # is killed at a random moment in the i-th RUNS-th of the time an
  # uninterrupted run takes on this machine, measured first: stratified
  # moments cover the run evenly however fast the machine starts and
  # trains, where moments drawn from fixed seconds could all fall in
  # start-up on a slow machine or after the end on a fast one.
  runs_count = 6
  start = time.monotonic()
  p = train(config_file, tmp_path / "timed")
  _, err = p.communicate(timeout=600)
  assert p.returncode == 0, err[-3000:]
  whole = time.monotonic() - start
  rng = random.Random(0)
  moments = [(i + rng.random()) / runs_count * whole for i in range(runs_count)]
  runs = [tmp_path / f"run{i}" for i in range(runs_count)]
  killed = 0
  for pair in range(0, runs_count, 2):
    started = time.monotonic()
    procs = [train(config_file, wd) for wd in runs[pair : pair + 2]]
    for proc, moment in zip(procs, moments[pair : pair + 2]):
      time.sleep(max(0.0, started + moment - time.monotonic()))
      proc.kill()
      proc.communicate()
      killed += proc.returncode == -signal.SIGKILL
    procs = [train(config_file, wd) for wd in runs[pair : pair + 2]]
    for proc in procs:
      _, err = proc.communicate(timeout=600)
      assert proc.returncode == 0, err[-3000:]
  # Two runs at a time are slower than one alone, so every kill should land
  # before its run ends; one that lands after it tested nothing.
  assert killed >= runs_count - 1, f"only {killed} of {runs_count} runs were killed mid-run"
  for wd in runs:
    assert_same_params(wd, reference)


@pytest.mark.slow
def test_sigkill_with_the_prefetcher_far_ahead_resumes_identically(
  config_file, reference, tmp_path
):
  # Eight steps' batches made ahead when the run is killed: the checkpoints
  # hold the position after the batches the steps consumed.
  workdir = tmp_path / "wd"
  p = train(config_file, workdir, "--config.prefetch_steps=8")
  wait_for_step(p, 9)
  p.kill()
  p.communicate()
  p = train(config_file, workdir, "--config.prefetch_steps=8")
  _, err = p.communicate(timeout=600)
  assert p.returncode == 0 and "resumed from step" in err, err[-3000:]
  assert_same_params(workdir, reference)


def slow_saves(seconds):
  """A config preamble: every save takes `seconds` more to finish in the background."""
  return f"""
import time
import orbax.checkpoint as ocp
_finalize = ocp.CheckpointManager._finalize
def slow_finalize(self, *args, **kwargs):
  time.sleep({seconds})
  return _finalize(self, *args, **kwargs)
ocp.CheckpointManager._finalize = slow_finalize
"""


# A document's tokens fail to load in the prefetch thread, as a book on a
# disk that went away would, once training is under way; every save takes
# half a second more to finish in the background.
FAILING_READ = (
  slow_saves(0.5)
  + """
import threading
from compressive.data import documents
from compressive.errors import DataError

_load = documents.TokenDocuments._load_tokens
_calls = [0]
def failing(self, i):
  if threading.current_thread() is not threading.main_thread():
    _calls[0] += 1
    if _calls[0] > 40:
      raise DataError(f"{self.description}[{i}]: cannot read (Input/output error)")
  return _load(self, i)
documents.TokenDocuments._load_tokens = failing
"""
)


@pytest.mark.slow
def test_an_error_in_the_prefetch_thread_is_one_line_and_the_save_finishes(tmp_path):
  cfg = write_config_file(
    tmp_path / "failing.py",
    {"num_train_steps": 60, "checkpoint_every_steps": 2, "eval_every_steps": 0},
    preamble=FAILING_READ,
  )
  p = train(cfg, tmp_path / "wd")
  _, err = p.communicate(timeout=600)
  last = err.strip().splitlines()[-1]
  assert p.returncode == 2, err[-12000:]
  assert last.startswith("error: ") and "cannot read (Input/output error)" in last, last
  assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
  names = os.listdir(tmp_path / "wd" / "checkpoints")
  assert names and not [n for n in names if "tmp" in n], names
  for step in ckpt_lib.Checkpointer(str(tmp_path / "wd"), read_only=True).all_steps():
    compressive.load(str(tmp_path / "wd"), step)  # finished whole, checksums and all


@pytest.mark.slow
def test_non_finite_loss_stops_without_saving_it(tmp_path, monkeypatch):
  config = tiny_experiment(**{"checkpoint_every_steps": 2, "eval_every_steps": 0})
  inject_nan_at(monkeypatch, 5)
  with pytest.raises(NonFiniteError, match="at step 5; the newest intact checkpoint is step 4"):
    train_lib.train_and_evaluate(to_train(config), str(tmp_path))
  assert ckpt_lib.Checkpointer(str(tmp_path), read_only=True).latest_step() == 4
  assert all(np.isfinite(p).all() for p in params_of(tmp_path))


def test_a_non_finite_loss_is_one_line_and_exit_code_1(capsys):
  # The entry points' user_errors() knows the error from compressive.errors,
  # whether or not the training loop was imported.
  from compressive import cli

  with pytest.raises(SystemExit) as stopped:
    with cli.user_errors():
      raise NonFiniteError(
        "non-finite loss or gradient at step 5; the newest intact checkpoint is step 4 in wd"
      )
  assert stopped.value.code == 1
  assert capsys.readouterr().err == (
    "error: non-finite loss or gradient at step 5; the newest intact checkpoint is step 4 in wd\n"
  )


@pytest.mark.slow
def test_corrupt_newest_checkpoint_is_named_and_intact_one_resumes(tmp_path):
  config = tiny_experiment(
    **{"num_train_steps": 9, "checkpoint_every_steps": 3, "eval_every_steps": 0}
  )
  straight = tmp_path / "straight"
  train_lib.train_and_evaluate(to_train(config), str(straight))
  broken = tmp_path / "broken"
  train_lib.train_and_evaluate(to_train(config), str(broken), stop_at_step=6)
  # Truncate every file of the newest checkpoint's state.
  newest = broken / "checkpoints" / "6" / "state"
  for root, _, files in os.walk(newest):
    for name in files:
      open(os.path.join(root, name), "wb").close()
  with pytest.raises(CheckpointError, match=r"checkpoints/6 is damaged.*--restore_intact"):
    train_lib.train_and_evaluate(to_train(config), str(broken))
  train_lib.train_and_evaluate(to_train(config), str(broken), restore_intact=True)
  assert_same_params(broken, straight)


@pytest.mark.slow
def test_resuming_with_other_shapes_names_the_fields(tmp_path):
  config = tiny_experiment(**{"num_train_steps": 3})
  train_lib.train_and_evaluate(to_train(config), str(tmp_path))
  other = tiny_experiment(**{"num_train_steps": 6, "model.d_model": 16, "batch_size": 2})
  with pytest.raises(ConfigError) as info:
    train_lib.train_and_evaluate(to_train(other), str(tmp_path))
  assert "model.d_model 32 -> 16" in str(info.value) and "batch_size 4 -> 2" in str(info.value)
  assert runconfig.load_config(str(tmp_path)).model.d_model == 32  # the saved config is kept


@pytest.mark.slow
def test_evaluation_never_modifies_checkpoints(reference):
  before = tree_digest(reference / "checkpoints")
  r = inprocess.run("eval.py", [f"--workdir={reference}", "--split=validation", "--max_segments=2"])
  assert r.returncode == 0, r.stderr[-3000:]
  compressive.load(str(reference))
  assert tree_digest(reference / "checkpoints") == before


# -- One trainer per workdir. ---------------------------------------------------------


@pytest.mark.slow
def test_a_second_trainer_on_the_same_workdir_is_refused(config_file, reference, tmp_path):
  workdir = tmp_path / "wd"
  first = train(config_file, workdir)
  wait_for_step(first, 3)
  # What people do about a lock they believe stale: the lock is not the file.
  os.remove(workdir / "train.lock")
  second = train(config_file, workdir, "--config.optimizer.learning_rate=0.1")
  _, err = second.communicate(timeout=300)
  lines = err.strip().splitlines()
  assert second.returncode == 2, err[-3000:]
  assert lines[-1].startswith("error: ") and "in use by another trainer" in lines[-1], lines[-3:]
  assert f"pid {first.pid} on host" in lines[-1]
  assert "Traceback" not in err
  _, err = first.communicate(timeout=600)
  assert first.returncode == 0, err[-3000:]
  assert not [n for n in os.listdir(workdir / "checkpoints") if "tmp" in n]
  # The first run's model and config are its own: nothing was overwritten.
  assert runconfig.load_config(str(workdir)).optimizer.learning_rate != 0.1
  assert_same_params(workdir, reference)


@pytest.mark.slow
def test_the_lock_is_held_in_process_and_released_after(tmp_path):
  from compressive.training.lock import WorkdirBusyError, WorkdirLock

  config = tiny_experiment(**{"num_train_steps": 2, "eval_every_steps": 0})
  with WorkdirLock(str(tmp_path)):
    with pytest.raises(WorkdirBusyError, match=r"in use by another trainer \(pid \d+ on host"):
      train_lib.train_and_evaluate(to_train(config), str(tmp_path))
  # Nothing read or written (checkpoints/ is the holder's: its lock made and holds it).
  assert sorted(os.listdir(tmp_path)) == ["checkpoints", "train.lock"]
  assert os.listdir(tmp_path / "checkpoints") == ["workdir.json"]  # the holder's record
  train_lib.train_and_evaluate(to_train(config), str(tmp_path))  # free again: trains
  with pytest.raises(ValueError):  # and an exception inside releases it too
    with WorkdirLock(str(tmp_path)):
      raise ValueError
  WorkdirLock(str(tmp_path)).acquire().release()


# -- Saves in flight finish, whatever ends the run. -----------------------------------


# Every save takes two seconds to finish in the background, and the first
# evaluation (right after the step-2 save) raises, as a corpus file that
# cannot be read would.
SLOW_SAVE_AND_FAIL = (
  slow_saves(2.0)
  + """
from compressive.evaluation import evaluate as eval_lib
from compressive.errors import DataError

def failing_evaluate(*args, **kwargs):
  raise DataError(REASON)
eval_lib.evaluate = failing_evaluate
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("reason", ["book 7 of the train split cannot be read"])
def test_an_error_during_an_async_save_still_finishes_the_save(tmp_path, reason):
  cfg = write_config_file(
    tmp_path / "slow.py",
    {"num_train_steps": 6, "checkpoint_every_steps": 2, "eval_every_steps": 2},
    preamble=f"REASON = {reason!r}\n" + SLOW_SAVE_AND_FAIL,
  )
  p = train(cfg, tmp_path / "wd")
  _, err = p.communicate(timeout=600)
  lines = [
    line for line in err.strip().splitlines() if line.startswith(("error", "Traceback", "  File"))
  ]
  assert p.returncode == 2 and lines == [f"error: {reason}"], err[-3000:]
  assert "cannot schedule new futures" not in err
  names = sorted(os.listdir(tmp_path / "wd" / "checkpoints"))
  assert names == ["2", "workdir.json"], names  # finished, not left as 2.orbax-checkpoint-tmp
  c = ckpt_lib.Checkpointer(str(tmp_path / "wd"), read_only=True)
  assert c.all_steps() == [2]
  compressive.load(str(tmp_path / "wd"))  # and it restores, checksums and all


SECOND_SIGNAL = """
import gc, os, signal, sys
from compressive.training import interrupts
stop = interrupts.SignalStop()
os.kill(os.getpid(), signal.SIGTERM)
assert stop.should_stop()

def callback(phase, info):
  if phase == "start":
    gc.callbacks.remove(callback)
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs, and raises, in here
    sum(range(1000))

if sys.argv[1] == "gc":
  gc.callbacks.append(callback)
  gc.collect()
  print("the collection finished")
  try:
    stop.should_stop()
  except KeyboardInterrupt:
    print("the next poll raised it")
else:  # the second signal arrives while a checkpoint save starts
  try:
    with interrupts.deferred():
      os.kill(os.getpid(), signal.SIGTERM)
      sum(range(1000))
      print("the deferred stretch finished")
  except KeyboardInterrupt:
    print("its end raised it")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
  "where,lines",
  [
    ("gc", ["the collection finished", "the next poll raised it"]),
    ("deferred", ["the deferred stretch finished", "its end raised it"]),
  ],
)
def test_a_second_signal_is_neither_lost_nor_let_into_a_save(where, lines):
  # Python drops an exception raised in a gc callback and prints a traceback;
  # one raised while Orbax starts a save would leave a half-made checkpoint.
  r = processes.run(
    [sys.executable, "-c", SECOND_SIGNAL, where],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.splitlines() == lines
  assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


@pytest.mark.slow
def test_a_second_signal_stops_at_once_with_one_line_and_a_whole_checkpoint(
  config_file, reference, tmp_path
):
  workdir = tmp_path / "wd"
  p = train(config_file, workdir)
  wait_for_step(p, 6)
  p.send_signal(signal.SIGTERM)
  time.sleep(0.05)
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=300)
  # Both signals are SIGTERM: the first asks for a stop after the step, the
  # second stops at once; either way the status is 128 + SIGTERM.
  assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
  assert "Traceback" not in err and "cannot schedule new futures" not in err, err[-3000:]
  assert err.strip().splitlines()[-1].startswith("error: stopped "), err[-3000:]
  names = os.listdir(workdir / "checkpoints")
  assert not [n for n in names if "tmp" in n], names
  p = train(config_file, workdir)
  _, err = p.communicate(timeout=600)
  assert p.returncode == 0, err[-3000:]
  assert_same_params(workdir, reference)


# -- A full disk and a read-only workdir (a small tmpfs; needs root's mount). ---------


@pytest.fixture
def small_disk(tmp_path, request):
  mount_point = tmp_path / "disk"
  mount_point.mkdir()
  size = getattr(request, "param", "1200k")
  r = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
    capture_output=True,
    text=True,
  )
  if r.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
  yield mount_point
  subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@pytest.mark.parametrize("where", ["wait_until_finished", "close"])
def test_a_refused_write_orbax_reports_at_the_wait_or_at_the_close_is_one_error(
  tmp_path, monkeypatch, where
):
  # Orbax reports a save's refused write from its threads, as a ValueError
  # carrying the OS error code, at whichever call first asks for it: the
  # wait for the save, or the close after a wait that returned (a whole
  # suite once met the full disk there, and train.py ended in a traceback).
  checkpointer = ckpt_lib.Checkpointer(str(tmp_path))
  data_state = {"position": np.zeros((2,), np.int64)}
  checkpointer.save(1, {"w": np.ones(3, np.float32)}, {}, data_state, run_identity_of())
  checkpointer.wait()
  refused = ValueError(
    "RESOURCE_EXHAUSTED: Error writing local file: No space left on device [os_error_code='28']"
  )
  manager = checkpointer._manager

  def refuse(*args, **kwargs):
    raise refused

  monkeypatch.setattr(manager, where, refuse)
  with pytest.raises(ckpt_lib.CheckpointWriteError) as raised:
    checkpointer.close()
  assert str(raised.value) == (
    f"cannot save a checkpoint in {checkpointer.directory}: No space left on device; "
    "the checkpoints saved before are intact (steps [1])"
  )
  assert raised.value.__cause__ is refused
  monkeypatch.undo()
  manager.close()


# 1200k holds about one checkpoint: the second save fails. 16k fills up at
# the first metrics write, before any checkpoint.
@pytest.mark.slow
@pytest.mark.parametrize("small_disk,saves", [("1200k", 1), ("16k", 0)], indirect=["small_disk"])
def test_a_full_disk_is_one_line_and_keeps_the_saved_checkpoints(small_disk, saves, tmp_path):
  cfg = write_config_file(
    tmp_path / "disk_cfg.py",
    {
      "num_train_steps": 8,
      "checkpoint_every_steps": 2,
      "eval_every_steps": 0,
      "log_every_steps": 1,
    },
  )
  workdir = small_disk / "wd"
  p = train(cfg, workdir)
  _, err = p.communicate(timeout=600)
  assert p.returncode == 2, err[-12000:]
  assert "Traceback" not in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("error: ") and "No space left on device" in last, last
  assert str(workdir) in last  # names where
  # What was saved before the disk filled up still restores.
  saved = ckpt_lib.Checkpointer(str(workdir), read_only=True).all_steps()
  assert len(saved) >= saves, os.listdir(workdir / "checkpoints")
  for step in saved:
    compressive.load(str(workdir), step)


@pytest.mark.slow
def test_a_read_only_workdir_is_one_line(small_disk, tmp_path, config_file):
  workdir = small_disk / "wd"
  workdir.mkdir()
  subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
  p = train(config_file, workdir)
  _, err = p.communicate(timeout=300)
  assert p.returncode == 2, err[-12000:]
  assert "Traceback" not in err
  last = err.strip().splitlines()[-1]
  assert last.startswith("error: ") and "Read-only file system" in last, last


@pytest.mark.slow
def test_a_bad_file_deep_in_a_text_split_stops_before_anything_compiles(tmp_path):
  # Forty good books and one that is not UTF-8, far from the first rows: it
  # used to be found when a row reached it, at step 9 or later.
  folder = tmp_path / "texts"
  folder.mkdir()
  for i in range(40):
    (folder / f"book{i:02d}.txt").write_text(("a fine sentence of text. " * 40 + "\n") * 4)
  (folder / "zz_bad.txt").write_bytes(b"fine so far \xff\xfe and then not")
  config = tiny_experiment(
    **{
      "data.source": "text_files",
      "data.text_files.path": str(folder),
      "num_train_steps": 30,
      "eval_every_steps": 0,
    }
  )
  compiled = []
  real = train_step.make_train_step
  monkey = pytest.MonkeyPatch()
  monkey.setattr(train_step, "make_train_step", lambda *a, **k: compiled.append(1) or real(*a, **k))
  try:
    with pytest.raises(DataError, match="zz_bad.txt"):
      train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"))
  finally:
    monkey.undo()
  assert not compiled
  assert not os.path.exists(tmp_path / "wd" / "checkpoints" / "1")
