"""Nothing lost while runs and readers share a workdir: readers that survive
rotation, every byte a resume depends on verified, side files that never
block a resume, an idempotent --restore_intact, and the tools' own
clean-ups."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import orbax.checkpoint as ocp
import pytest

import compressive
from compressive import data as data_lib
from compressive.errors import CheckpointError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import exporting, inference, integrity, layout, runconfig
from compressive.training import loop as train_lib
from compressive.training.metrics import read_jsonl
from helpers import ROOT, assert_same_params, tiny_experiment, to_train, write_config_file
import inprocess
import processes


def config(**overrides):
  values = {
    "num_train_steps": 6,
    "checkpoint_every_steps": 2,
    "eval_every_steps": 0,
    "log_every_steps": 1,
  }
  values.update(overrides)
  return tiny_experiment(**values)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("straight") / "wd"
  train_lib.train_and_evaluate(to_train(config()), str(workdir))
  return workdir


def half_trained(tmp_path, **overrides):
  workdir = tmp_path / "wd"
  train_lib.train_and_evaluate(to_train(config(**overrides)), str(workdir), stop_at_step=4)
  return workdir


# -- 1. Readers never mistake rotation for damage. ------------------------------------


@pytest.mark.slow
def test_a_step_deleted_while_it_is_read_is_not_called_damaged(tmp_path, monkeypatch):
  # The trainer's rotation deletes a step's files one by one: the reader's
  # first read fails as on damage (an item not found) while the folder is
  # still there, and the folder is gone a moment later.
  workdir = half_trained(tmp_path)
  real = ocp.CheckpointManager.restore
  victim = {"step": 4, "done": False}

  def racing(self, step, *args, **kwargs):
    if step == victim["step"] and not victim["done"]:
      victim["done"] = True
      where = workdir / "checkpoints" / str(step)
      shutil.rmtree(where / "data")
      threading.Timer(0.05, shutil.rmtree, args=(where,)).start()
    return real(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", racing)
  _, _, step = compressive.load_with_step(str(workdir))
  assert step == 2 and victim["done"]  # the newest step left, not an error


def _listings(monkeypatch, during=lambda: None):
  """The steps each of Orbax's readings of the checkpoints folder found;
  `during` runs after each, as a trainer would between Orbax's listing
  and its check of each entry."""
  real, found = ckpt_lib._manager, []

  def reading(*args, **kwargs):
    manager = real(*args, **kwargs)
    found.append(manager.all_steps())
    during()
    return manager

  monkeypatch.setattr(ckpt_lib, "_manager", reading)
  return found


def test_a_listing_a_finishing_save_emptied_is_read_again(tmp_path, monkeypatch):
  # Orbax lists the checkpoints folder, then checks that each entry is a
  # finished step; a trainer that renames its new step into place (and
  # deletes the old one) in between leaves that reading with no step at
  # all, where a reader would say "no checkpoint". The folder changed under
  # the reading: it is read again, and finds the new step.
  steps = tmp_path / "wd" / "checkpoints"
  unfinished = steps / "3.orbax-checkpoint-tmp-17"
  unfinished.mkdir(parents=True)

  def finish():
    if unfinished.exists():
      unfinished.rename(steps / "3")

  found = _listings(monkeypatch, during=finish)
  reader = ckpt_lib.Checkpointer(str(tmp_path / "wd"), read_only=True, create=False)
  assert found == [[], [3]] and reader.all_steps() == [3]


def test_a_reload_a_finishing_save_emptied_is_read_again(tmp_path, monkeypatch):
  # The same race at the re-reading after a step vanished while it was read
  # (inference._restore_newest): the old step is gone, the new one is still
  # under its temporary name when Orbax lists, and in place when it checks.
  steps = tmp_path / "wd" / "checkpoints"
  (steps / "2").mkdir(parents=True)
  reader = ckpt_lib.Checkpointer(str(tmp_path / "wd"), read_only=True, create=False)
  (steps / "2").rmdir()
  unfinished = steps / "3.orbax-checkpoint-tmp-17"
  unfinished.mkdir()
  manager, found = reader._manager, []
  real = manager.reload

  def reload():
    real()
    found.append(manager.all_steps())
    if unfinished.exists():
      unfinished.rename(steps / "3")

  monkeypatch.setattr(manager, "reload", reload)
  reader.reload()
  assert found == [[], [3]] and reader.all_steps() == [3]


def test_a_folder_with_no_finished_step_is_read_once(tmp_path, monkeypatch):
  # A save killed half-way and no trainer: nothing changes, nothing to wait for.
  (tmp_path / "wd" / "checkpoints" / "3.orbax-checkpoint-tmp-17").mkdir(parents=True)
  found = _listings(monkeypatch)
  reader = ckpt_lib.Checkpointer(str(tmp_path / "wd"), read_only=True, create=False)
  assert found == [[]] and reader.all_steps() == []


@pytest.mark.slow
def test_readers_in_a_loop_beside_a_trainer_rotating_every_step(tmp_path):
  cfg = write_config_file(
    tmp_path / "rotate.py",
    {
      "num_train_steps": 400,
      "checkpoint_every_steps": 1,
      "keep_checkpoints": 1,
      "eval_every_steps": 0,
      "log_every_steps": 1,
    },
  )
  workdir = tmp_path / "wd"
  trainer = processes.start(
    [sys.executable, "train.py", f"--config={cfg}", f"--workdir={workdir}"],
    cwd=ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    for line in trainer.stderr:
      if "checkpoint of step 3" in line:
        break
    threading.Thread(target=trainer.stderr.read, daemon=True).start()
    loads = 0
    evals = []
    while trainer.poll() is None and loads < 16:
      if loads % 8 == 0:
        evals.append(
          processes.start(
            [sys.executable, "eval.py", f"--workdir={workdir}", "--max_segments=2"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
          )
        )
      compressive.load(str(workdir))  # never DamagedCheckpointError
      loads += 1
    results = [p.communicate(timeout=300) for p in evals]
  finally:
    trainer.kill()
    trainer.wait()
  assert loads >= 8
  for p, (_, err) in zip(evals, results):
    assert p.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "damaged" not in err, err[-3000:]


class _Rotating:
  """A checkpointer beside a trainer that rotates away every step a reader
  reads, until `lasts_from` (then the newest stays: the trainer stopped)."""

  directory = "/run/checkpoints"

  def __init__(self, lasts_from: int = 10**9):
    self.newest, self.reads, self.lasts_from = 10, 0, lasts_from

  def latest_step(self) -> int:
    return self.newest

  def restore(self, step: int, abstract_state, identity):
    self.reads += 1
    if step >= self.lasts_from:
      return ("state", None)
    self.newest += 1  # the trainer saved the next step and deleted this one
    raise ckpt_lib.MissingStepError(f"checkpoint {step} was deleted while it was read")

  def reload(self) -> None:
    pass


def test_a_reader_reads_the_newest_for_as_long_as_steps_go_away_then_says_why():
  # Not a count of tries: a reader on a loaded machine may lose the race
  # with a trainer rotating every step many times in a row (CI's neighbours).
  slow = _Rotating(lasts_from=45)
  assert inference._restore_newest(slow, None, None, {}) == (45, "state")
  assert slow.reads == 36
  never = _Rotating()
  with pytest.raises(ckpt_lib.MissingStepError, match="keep_checkpoints") as e:
    inference._restore_newest(never, None, None, {}, patience_s=0.2)
  assert never.reads > 1 and "was deleted while it was read" in str(e.value)
  # A step asked for by number is never swapped for another; a newest step
  # that goes away with nothing newer after it is no race: said at once.
  with pytest.raises(ckpt_lib.MissingStepError):
    inference._restore_newest(_Rotating(), 12, None, {})
  stale = _Rotating()
  stale.latest_step = lambda: 10
  with pytest.raises(ckpt_lib.MissingStepError, match="checkpoint 10 was deleted") as e:
    inference._restore_newest(stale, None, None, {})
  assert stale.reads == 2 and "keep_checkpoints" not in str(e.value)


@pytest.mark.parametrize("vanished", [FileNotFoundError, NotADirectoryError])
def test_a_listing_that_meets_a_step_deleted_under_it_lists_again(vanished):
  # Orbax lists the steps, then reads each one's metadata: a step rotated
  # away in between is either error, as Orbax checks the folder or the file.
  calls = []

  def read():
    calls.append(1)
    if len(calls) < 3:
      raise vanished("checkpoints/15")
    return [16]

  assert ckpt_lib._listing(read) == [16] and len(calls) == 3

  def always():
    raise vanished("checkpoints/15")

  with pytest.raises(vanished):  # a folder that stays gone is no race: the error stands
    ckpt_lib._listing(always, attempts=2)


# -- 2. Every byte a resume depends on is verified. ----------------------------------


@pytest.mark.slow
def test_an_edited_data_position_is_damage(tmp_path):
  workdir = half_trained(tmp_path)
  path = workdir / "checkpoints" / "4" / "data" / "metadata"
  position = json.loads(path.read_text())
  position["offset"][0] += 3
  path.write_text(json.dumps(position))
  with pytest.raises(integrity.DamagedCheckpointError, match="data position"):
    train_lib.train_and_evaluate(to_train(config()), str(workdir))


@pytest.mark.slow
def test_an_edited_config_is_named_by_every_reader(tmp_path):
  # A longer memory than trained: the same parameters, another model's
  # numbers (as the paper's own evaluation settings say: config.eval is the
  # place for other evaluation sizes).
  workdir = half_trained(tmp_path)
  path = workdir / "config.json"
  saved = json.loads(path.read_text())
  saved["model"]["memory_length"] = 16
  path.write_text(json.dumps(saved))
  with pytest.raises(integrity.RunMismatchError, match="model.memory_length 8 -> 16"):
    compressive.load(str(workdir))
  r = inprocess.run("eval.py", [f"--workdir={workdir}", "--max_segments=1"])
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1].startswith("error: the model config differs")


@pytest.mark.slow
def test_a_tokenizer_retrained_in_place_is_named(tmp_path):
  from helpers import generated_texts, sentencepiece_run_fields

  fields = sentencepiece_run_fields(tmp_path)
  model = tmp_path / "m.model"
  workdir = half_trained(tmp_path, **fields)
  compressive.load(str(workdir))
  # Retrained in place on other texts: a vocabulary of the same size whose
  # ids mean other pieces.
  data_lib.train_sentencepiece(generated_texts(30, seed=1), 320, str(model))
  with pytest.raises(integrity.RunMismatchError, match="the tokenizer differs"):
    compressive.load(str(workdir))


@pytest.mark.slow
def test_a_changed_corpus_is_named_on_resume_and_can_be_accepted(tmp_path):
  texts = tmp_path / "texts"
  texts.mkdir()
  for i in range(8):
    (texts / f"book{i}.txt").write_text(f"Book {i}. " + "fine words go here. " * 30)
  fields = {"data.source": "text_files", "data.text_files.path": str(texts)}
  workdir = half_trained(tmp_path, **fields)
  (texts / "book3.txt").write_text("Book 3, rewritten. " + "other words. " * 31)
  with pytest.raises(integrity.RunMismatchError, match="the training corpus differs"):
    train_lib.train_and_evaluate(to_train(config(**fields)), str(workdir))
  train_lib.train_and_evaluate(to_train(config(**fields)), str(workdir), accept_changed_corpus=True)
  assert ckpt_lib.Checkpointer(str(workdir), read_only=True).latest_step() == 6


@pytest.mark.slow
def test_a_changed_number_of_documents_goes_on_when_accepted(tmp_path, caplog):
  # docs/LONG_RUNS.md: --accept_changed_corpus goes on "on another data
  # section, deliberately"; one with more documents than the saved position
  # indexes goes on at the next epoch of every row.
  workdir = half_trained(tmp_path)
  more = {"data.synthetic.num_docs": (21, 4, 4)}
  with pytest.raises(integrity.RunMismatchError, match="the data config differs"):
    train_lib.train_and_evaluate(to_train(config(**more)), str(workdir))
  train_lib.train_and_evaluate(to_train(config(**more)), str(workdir), accept_changed_corpus=True)
  assert ckpt_lib.Checkpointer(str(workdir), read_only=True).latest_step() == 6
  assert "every row goes on at the start of its next epoch" in caplog.text


@pytest.mark.slow
def test_an_edited_export_is_refused(tmp_path, straight):
  out = tmp_path / "export"
  exporting.export(str(straight), str(out))
  compressive.load(str(out))
  for name, edit in (
    ("export.json", lambda m: m.update(step=5)),
    ("config.json", lambda c: c["model"].update(dropout_rate=0.5)),
  ):
    copy = tmp_path / f"edited_{name}"
    shutil.copytree(out, copy)
    record = json.loads((copy / name).read_text())
    edit(record)
    (copy / name).write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="changed since"):
      compressive.load(str(copy))


# -- 3. Side files never block a resume. ----------------------------------------------


@pytest.mark.slow
def test_a_metrics_line_cut_short_does_not_block_the_resume(tmp_path, straight):
  workdir = half_trained(tmp_path)
  with open(workdir / "metrics_train.jsonl", "a") as f:
    f.write('{"step": 5, "loss": 3.1')  # a crash in the middle of the write
  train_lib.train_and_evaluate(to_train(config()), str(workdir))
  assert [r["step"] for r in read_jsonl(str(workdir / "metrics_train.jsonl"))] == list(range(1, 7))
  assert_same_params(workdir, straight)


@pytest.mark.slow
def test_a_damaged_config_json_is_set_aside_and_the_run_resumes(tmp_path, straight):
  workdir = half_trained(tmp_path)
  (workdir / "config.json").write_text('{"model": {"d_model": 3')
  train_lib.train_and_evaluate(to_train(config()), str(workdir))
  assert (workdir / "config.json.damaged").exists()
  assert runconfig.load_config(str(workdir)).model.d_model == config().model.d_model
  assert_same_params(workdir, straight)


def test_a_refused_metrics_write_leaves_whole_lines(tmp_path, monkeypatch):
  from compressive.training import metrics

  path = tmp_path / "m.jsonl"
  metrics.append_line(str(path), '{"step": 1}')
  real = os.write
  monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[:5]))  # the disk filled
  with pytest.raises(OSError):
    metrics.append_line(str(path), '{"step": 2, "loss": 1.0}')
  monkeypatch.undo()
  assert path.read_text() == '{"step": 1}\n'


# -- 4. --restore_intact is idempotent. -----------------------------------------------


@pytest.mark.slow
def test_a_second_restore_intact_stops_the_same_way(tmp_path):
  workdir = half_trained(tmp_path)
  for step in (2, 4):  # every step damaged
    for root, _, files in os.walk(workdir / "checkpoints" / str(step) / "state"):
      for name in files:
        open(os.path.join(root, name), "wb").close()
  for _ in range(2):  # a scheduler's retry of the same command
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* restores.*nothing was trained"):
      train_lib.train_and_evaluate(to_train(config()), str(workdir), restore_intact=True)
  assert sorted(os.listdir(workdir / "checkpoints" / "skipped")) == ["2", "4"]
  assert ckpt_lib.Checkpointer(str(workdir), read_only=True).all_steps() == []


# -- The tools clean up after themselves. ---------------------------------------------


@pytest.mark.slow
def test_an_export_killed_mid_write_is_cleaned_up_by_the_next(tmp_path, straight):
  dead = processes.start([sys.executable, "-c", "pass"])
  dead.wait()  # a pid that no longer runs
  abandoned = tmp_path / f"{layout.PARTIAL_EXPORT_PREFIX}{dead.pid}"
  (abandoned / "params").mkdir(parents=True)
  exporting.export(str(straight), str(tmp_path / "out"))
  assert sorted(os.listdir(tmp_path)) == ["out"]


# The runner's own signal handling around one child that saves on SIGTERM.
RUNNER = """
import os, signal, sys
from absl import flags
from compressive import cli
from experiments import run
flags.FLAGS([sys.argv[0], "--experiment=ablation"])
child = (
    "import os, signal, sys, time\\n"
    "def stop(signum, frame):\\n"
    # Written aside and renamed: a reader never sees the file half written.
    "  open(sys.argv[1] + '.part', 'w').write('saved')\\n"
    "  os.replace(sys.argv[1] + '.part', sys.argv[1])\\n"
    "  sys.exit(0)\\n"
    "signal.signal(signal.SIGTERM, stop)\\n"
    "print('ready', file=sys.stderr, flush=True)\\n"
    "time.sleep(60)\\n")
signal.signal(signal.SIGTERM, run.Child.forward)
with cli.user_errors():
  run.run_tool(["-c", child, os.environ["SAVED"]])
print("went on", flush=True)
"""


def start_runner(saved):
  """RUNNER started, once its child has said it is ready."""
  p = processes.start(
    [sys.executable, "-c", RUNNER],
    cwd=ROOT,
    env=dict(os.environ, SAVED=str(saved), PYTHONPATH=ROOT),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  for line in p.stderr:
    if line.strip() == "ready":  # the child's own line, not the command the runner echoes
      break
  return p


@pytest.mark.slow
def test_a_signal_to_the_experiment_runner_reaches_its_child(tmp_path):
  saved = tmp_path / "saved"
  p = start_runner(saved)
  p.send_signal(signal.SIGTERM)
  out, err = p.communicate(timeout=60)
  assert saved.read_text() == "saved"  # the child got the signal and saved
  assert p.returncode == 128 + signal.SIGTERM and "went on" not in out
  assert err.strip().splitlines()[-1].startswith("error: stopped by SIGTERM"), err


@pytest.mark.slow
def test_kill_9_to_the_experiment_runner_stops_its_child(tmp_path):
  # The runner cannot forward a SIGKILL: its child learns of its death from
  # the kernel (PR_SET_PDEATHSIG) as a SIGTERM, and saves as on preemption.
  saved = tmp_path / "saved"
  p = start_runner(saved)
  p.kill()
  p.wait()
  deadline = time.time() + 30
  while not saved.exists() and time.time() < deadline:
    time.sleep(0.1)
  assert saved.exists() and saved.read_text() == "saved"  # the child did not sleep on alone


def caught(pid, signum) -> bool:
  """Whether process `pid` has a handler of its own for `signum` (Linux)."""
  with open(f"/proc/{pid}/status") as f:
    mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
  return bool(int(mask, 16) >> (signum - 1) & 1)


@pytest.mark.slow
@pytest.mark.fresh_interpreter  # the signal is to arrive while JAX is being imported
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_train_pys_first_second_is_one_line(tmp_path, signum):
  p = processes.start(
    [sys.executable, "train.py", f"--workdir={tmp_path / 'wd'}"],
    cwd=ROOT,
    env=dict(os.environ, PYTHONPATH=ROOT),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  # Once the script catches the signal (its first lines), while JAX is
  # still being imported: /proc tells when.
  deadline = time.time() + 30
  while time.time() < deadline and not caught(p.pid, signal.SIGTERM):  # SIGINT's is next
    time.sleep(0.005)
  time.sleep(0.02)
  p.send_signal(signum)
  out, err = p.communicate(timeout=120)
  assert p.returncode == 128 + signum, (p.returncode, err[-2000:])  # as a shell reports it
  assert "Traceback" not in err
  assert (
    err.strip()
    .splitlines()[-1]
    .startswith(f"error: stopped at once by {signal.Signals(signum).name}")
  ), err
