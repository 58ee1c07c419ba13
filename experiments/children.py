"""The tools as experiments/run.py runs them: each a child process in the
repository, as a user runs it, that dies with the runner, and the runs'
summaries and results read back from what the tools wrote."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from typing import Callable, Optional

from compressive import cli, errors, files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Child:
  """The one tool this runner has running: a SIGTERM or SIGINT to the runner
  is passed on to it (train.py then saves its step and exits), and the
  runner stops once it has, instead of leaving it to train on alone. A
  signal that comes while no child runs, or while one is being started,
  is kept and acted on at once after."""

  process: subprocess.Popen | None = None
  signalled: int | None = None

  @classmethod
  def forward(cls, signum, frame) -> None:
    del frame
    cls.signalled = signum
    if cls.process is not None and cls.process.poll() is None:
      cls.process.send_signal(signum)

  @classmethod
  def stop_if_signalled(cls, code: Optional[int] = None, what: str = "") -> None:
    if cls.signalled is not None:
      ran = f" while {what} ran (it exited with {code})" if what else " between runs"
      cli.fail(
        f"stopped by {signal.Signals(cls.signalled).name}{ran}; the same command goes "
        "on from where the runs stopped",
        code=errors.exit_status(cls.signalled),
      )


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with_this_process() -> Optional[Callable[[], None]]:
  """A child's preexec_fn: the child gets SIGTERM when this runner dies,
  however it dies (`kill -9` included; Linux's PR_SET_PDEATHSIG), so
  train.py saves its step and exits instead of training on alone. None
  where prctl is not there (then only the signals `_Child` forwards reach
  the child)."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None
  runner = os.getpid()

  def in_the_child() -> None:
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != runner:  # the runner died before that took effect
      os.kill(os.getpid(), signal.SIGTERM)

  return in_the_child


def run_tool(args: list[str]) -> str:
  Child.stop_if_signalled()
  cmd = [sys.executable] + args
  print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
  Child.process = subprocess.Popen(
    cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=_dies_with_this_process()
  )
  if Child.signalled is not None:  # it came while the child was being started
    Child.process.send_signal(Child.signalled)
  try:
    stdout, _ = Child.process.communicate()
  finally:
    code, Child.process = Child.process.wait(), None
  Child.stop_if_signalled(code, args[0])
  if code < 0:
    cli.fail(f"{args[0]} was killed by {signal.Signals(-code).name}", code=1)
  if code:  # the tool printed its own error line
    sys.exit(code)
  return stdout


def train(workdir: str, config: str, *overrides: str) -> dict:
  """Trains (or finishes) a run; returns its training summary."""
  saved = os.path.join(workdir, "config.json")
  done = os.path.exists(saved) and os.path.isdir(
    os.path.join(workdir, "checkpoints", str(json.load(open(saved))["num_train_steps"]))
  )
  if not done:  # (train.py would resume and stop, after building the data: minutes here)
    run_tool(["train.py", f"--config={config}", f"--workdir={workdir}", *overrides])
  return train_summary(workdir)


def train_summary(workdir: str, since_step: int = 0) -> dict:
  """Steps, seconds and tokens of a run's training from its metrics; with
  since_step, of the steps after it only (a run resumed from another's
  checkpoint with another number of segments per step)."""
  rows = [
    r
    for r in map(json.loads, open(os.path.join(workdir, "metrics_train.jsonl")))
    if r["step"] > since_step
  ]
  seconds, tokens = 0.0, 0
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  per_step = config["batch_size"] * config["segments_per_step"] * config["model"]["segment_length"]
  prev = since_step
  curve = []
  for r in rows:
    n = (r["step"] - prev) * per_step
    seconds += n / r["tokens_per_second"]
    tokens += n
    prev = r["step"]
    curve.append((r["step"], seconds, r["bits_per_byte"]))
  return {
    "steps": prev,
    "train_seconds": seconds,
    "train_tokens": tokens,
    "tokens_per_second": tokens / seconds,
    "curve": curve,
  }


def evaluate(workdir: str, split: str = "test", max_segments: int | None = None) -> dict:
  tag = f"_first{max_segments}" if max_segments else ""
  cached = os.path.join(workdir, f"result_{split}{tag}.json")
  if os.path.exists(cached):
    return json.load(open(cached))
  args = ["eval.py", f"--workdir={workdir}", f"--split={split}"]
  if max_segments:
    args.append(f"--max_segments={max_segments}")
  result = json.loads(run_tool(args).strip().splitlines()[-1])
  write_json(cached, result)
  return result


def write_json(path: str, obj) -> None:
  """Replaces `path` with `obj` as JSON whole (files.write_text: a crash
  leaves the old file, a full disk names the file)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  files.write_text(path, json.dumps(obj, indent=2) + "\n")
