"""Every stop signal is a stop, on every process: SIGHUP (a closed terminal
or SSH session) and what schedulers send (SIGUSR1, SIGUSR2, SIGXCPU) are
handled like SIGTERM (the step finished and checkpointed, one line, exit
128 + the signal); a stop asked for during an evaluation is acted on at the
next segment's boundary, the evaluation dropped; a reading tool stops with
one line and the same status; and a process of a multi-host run that is
stopped, or whose partners never join, ends within --join_timeout with one
line instead of waiting on the others."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from compressive.errors import STOP_SIGNALS
from compressive.evaluation import evaluate as eval_lib
from compressive.training import checkpoint as ckpt_lib
from compressive.training import loop as train_lib
from compressive.training import metrics
from helpers import (
  ROOT,
  process_env,
  tiny_experiment,
  to_train,
  untrained_workdir,
  write_config_file,
)
import processes

# Generous for a loaded 2-core machine (a process's start imports JAX), far
# below a hang.
SLACK_S = 120


def train(config, workdir, *extra, env=None):
  return processes.start(
    [sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}", *extra],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def wait_for(proc, text, timeout=300):
  deadline = time.time() + timeout
  for line in proc.stderr:
    if text in line:
      return
    if time.time() > deadline:
      break
  raise AssertionError(f"no line holding {text!r}")


@pytest.mark.slow  # signals to a process of its own
@pytest.mark.parametrize(
  "signum", [signal.SIGHUP, signal.SIGUSR1, signal.SIGXCPU], ids=["SIGHUP", "SIGUSR1", "SIGXCPU"]
)
def test_a_terminals_or_schedulers_signal_checkpoints_and_stops_like_sigterm(tmp_path, signum):
  # SIGHUP (the issue's: a closed SSH session) killed the trainer at once,
  # exit 129, with no checkpoint of the steps since the last and no line.
  config = write_config_file(
    tmp_path / "c.py",
    {
      "num_train_steps": 400,
      "checkpoint_every_steps": 100,
      "eval_every_steps": 0,
      "log_every_steps": 1,
    },
  )
  p = train(config, tmp_path / "wd")
  wait_for(p, "step 3/")
  p.send_signal(signum)
  _, err = p.communicate(timeout=SLACK_S + 60)
  name = signal.Signals(signum).name
  assert p.returncode == 128 + signum, err[-3000:]
  stopped = ckpt_lib.Checkpointer(str(tmp_path / "wd"), read_only=True).latest_step()
  assert 3 <= stopped < 100  # the step it stopped after, checkpointed
  assert f"{name} received: stopping after this step" in err
  assert err.strip().splitlines()[-1] == (
    f"error: stopped by {name} after step {stopped} of 400 (checkpointed); the same command "
    "resumes from there"
  ), err[-3000:]


def test_every_stop_signal_is_one_a_trainer_and_a_tool_hear():
  assert {
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGXCPU,
  } == set(STOP_SIGNALS)
  with open(os.path.join(ROOT, "train.py")) as f:  # the script holds them before any import
    held = f.read().split("for _signum in (", 1)[1].split(")", 1)[0]
  assert {f"signal.{signal.Signals(s).name}" for s in STOP_SIGNALS} == {
    w.strip() for w in held.replace("\n", " ").split(",") if w.strip()
  }


def test_a_stop_during_an_evaluation_is_acted_on_at_the_next_segment(tmp_path, monkeypatch):
  # The stop waited for the whole evaluation before the step was saved.
  segments = []
  original = eval_lib.stream

  def counted(*args, **kwargs):
    for segment in original(*args, **kwargs):
      segments.append(segment)
      yield segment

  monkeypatch.setattr(eval_lib, "stream", counted)
  config = tiny_experiment(
    num_train_steps=6, eval_every_steps=3, checkpoint_every_steps=0, **{"eval.max_segments": 0}
  )  # the whole split: many segments
  workdir = str(tmp_path / "wd")
  asked = lambda: len(segments) >= 3  # noqa: E731  (a stop asked for mid-evaluation)
  train_lib.train_and_evaluate(to_train(config), workdir, should_stop=asked)
  assert len(segments) == 3  # it stopped at the boundary after the third
  assert ckpt_lib.Checkpointer(workdir, read_only=True).all_steps() == [3]  # the step saved
  evals = metrics.read_jsonl(os.path.join(workdir, "metrics_eval.jsonl"))
  assert evals == []  # the dropped evaluation wrote nothing


# Runs the script of argv[1] with SIGHUP at its default disposition.
DEFAULT_SIGHUP = (
  "import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
  "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.slow  # a signal to a process of its own
def test_a_reading_tool_stops_with_one_line_and_the_signals_status(tmp_path):
  # An evaluation of minutes (2,000 documents), stopped at its first
  # progress line: it is evaluating however loaded the machine is.
  workdir = untrained_workdir(
    tmp_path / "wd",
    tiny_experiment(
      **{
        "data.synthetic.num_docs": (16, 2000, 4),
        "data.synthetic.max_length": 4000,
        "data.synthetic.min_length": 3000,
      }
    ),
  )
  # Started as a terminal's shell starts it, SIGHUP at its default: a tool
  # keeps a stop signal its parent ignores ignored (nohup), and the suite
  # may itself run under nohup.
  p = processes.start(
    [sys.executable, "-c", DEFAULT_SIGHUP, "eval.py", f"--workdir={workdir}"],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  wait_for(p, "eval: segment")
  p.send_signal(signal.SIGHUP)
  out, err = p.communicate(timeout=SLACK_S)
  assert p.returncode == 128 + signal.SIGHUP and out == "", (p.returncode, err[-3000:])
  assert err.strip().splitlines()[-1] == "error: stopped by SIGHUP", err[-3000:]
  assert "Traceback" not in err


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow  # processes of a multi-host run
def test_a_process_whose_partners_never_join_or_that_is_stopped_ends_with_one_line(tmp_path):
  # A SIGTERM before the process joined printed its line and did not exit;
  # the other waited at "Connecting to JAX distributed service" (JAX's own
  # wait: 300 s, then a fatal log and a stack dump).
  config = write_config_file(tmp_path / "c.py", {"num_train_steps": 2})
  port, timeout = _free_port(), 15
  common = [
    f"--coordinator_address=127.0.0.1:{port}",
    "--num_processes=2",
    f"--join_timeout={timeout}",
  ]
  env = process_env(devices=2)
  start = time.monotonic()
  alone = train(config, tmp_path / "a", *common, "--process_id=0", env=env)
  _, err = alone.communicate(timeout=timeout + SLACK_S)
  assert time.monotonic() - start < timeout + SLACK_S
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  assert alone.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
  assert errors[0] == (
    f"error: the run's processes did not all join within {timeout} s at "
    f"127.0.0.1:{port} (--join_timeout): start the same command on every "
    "host, each with its own --process_id"
  )
  stopped = train(config, tmp_path / "b", *common, "--process_id=1", env=env)
  wait_for(stopped, "Connecting to JAX distributed service")
  stopped.send_signal(signal.SIGTERM)
  _, err = stopped.communicate(timeout=SLACK_S)
  assert stopped.returncode == 128 + signal.SIGTERM, err[-3000:]
  assert err.strip().splitlines()[-1].startswith("error: stopped at once by SIGTERM"), err[-3000:]
  assert not os.path.lexists(tmp_path / "a") and not os.path.lexists(tmp_path / "b")
