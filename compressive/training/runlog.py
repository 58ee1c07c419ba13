"""What a run tells its user while it trains: the log file (WORKDIR/train.log),
the hyperparameters, one metrics record and log line per `log_every_steps`
(from the steps' metrics, left on the device until a step must look at
them), training's own wall time (throughput, ETA, the closing totals) and
the profiler trace of --profile_steps.

The records themselves are written by metrics.py (MetricWriter: JSON lines
and TensorBoard); this module decides what goes into them and when.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from compressive import experiment as experiment_lib
from compressive import files, values
from compressive.model import losses
from compressive.model.block import BANKS
from compressive.scale import flops as flops_lib
from compressive.training import layout, writers
from compressive.training import step as train_step
from compressive.training.metrics import MetricWriter, truncate_jsonl

_log = logging.getLogger("compressive")


class LogFile(logging.FileHandler):
  """WORKDIR/train.log: appends the logger's lines. Opened only as a regular
  file (files.open_regular: never a link followed, never a FIFO waited
  on). A write that fails (a full disk) stops the file with one warning
  naming it instead of printing logging's traceback for every line; the
  console keeps the log, and closing the file never raises."""

  def _open(self) -> io.TextIOWrapper:
    fd = files.open_regular(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)

  def handleError(self, record: logging.LogRecord) -> None:
    self._failed_with(sys.exc_info()[1])

  def _failed_with(self, e: Optional[BaseException]) -> None:
    if getattr(self, "_failed", False):
      return
    self._failed = True
    why = getattr(e, "strerror", None) or str(e) or type(e).__name__
    print(
      f"warning: cannot write {self.baseFilename} ({why}); the log goes on on the console only",
      file=sys.stderr,
    )

  def emit(self, record: logging.LogRecord) -> None:
    if not getattr(self, "_failed", False):
      super().emit(record)

  def close(self) -> None:
    # The stream's buffer may still hold lines the disk refused: its flush
    # on close fails again, an OSError that names no file.
    try:
      super().close()
    except OSError as e:
      self._failed_with(e)
      self.stream = None


def add_log_file(workdir: layout.Where) -> Optional[logging.Handler]:
  """Adds WORKDIR/train.log to the "compressive" logger; None if this process
  already logs to that file (a call within a call must not double lines)."""
  path = layout.workdir(workdir).absolute().log
  if any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in _log.handlers):
    return None
  handler = LogFile(path, mode="a", encoding="utf-8")
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  _log.addHandler(handler)
  return handler


class Profiler:
  """A JAX profiler trace of steps START..END (inclusive): started before
  the first of them this run makes, stopped once END's results are ready;
  stopped too if the run ends inside the range (an error, a stop request)."""

  def __init__(self, steps: Optional[tuple[int, int]], logdir: str) -> None:
    self.steps, self.logdir, self.tracing, self.done = steps, logdir, False, False

  def __enter__(self) -> "Profiler":
    return self

  def before(self, step: int) -> None:
    if self.steps and not (self.tracing or self.done) and self.steps[0] <= step <= self.steps[1]:
      jax.profiler.start_trace(self.logdir)
      self.tracing = True
      _log.info("profiling steps %d-%d into %s", step, self.steps[1], self.logdir)

  def after(self, step: int, outputs: Any) -> None:
    if self.tracing and self.steps and step >= self.steps[1]:
      jax.block_until_ready(outputs)
      self._stop()
      _log.info("profile of steps up to %d written to %s", step, self.logdir)

  def _stop(self) -> None:
    self.tracing, self.done = False, True
    jax.profiler.stop_trace()

  def __exit__(self, *exc: object) -> None:
    if self.tracing:
      try:
        self._stop()
      except Exception as e:
        if exc[0] is None:
          raise
        _log.warning("the profile trace could not be written: %s", e)


class Clock:
  """Training's own wall time, for throughput and the ETA: the first step's
  compilation, checkpoint waits and evaluations are left out of it, and
  totalled for the run's closing line."""

  def __init__(self) -> None:
    self.start = time.time()
    self.since, self.steps = self.start, 0  # the window since the last log line
    self.spent = {"eval": 0.0, "save": 0.0}
    self.times = {"eval": 0, "save": 0}

  def stepped(self, first: bool) -> None:
    """A step was dispatched. The first of a run returns once compiled
    (jit compiles before it dispatches), so its wait is the compilation (and
    its input), which is logged and left out; its computing counts."""
    self.steps += 1
    if first:
      _log.info("first step compiled and dispatched in %.1f s", time.time() - self.since)
      self.since = time.time()

  def restart(self) -> None:
    self.since, self.steps = time.time(), 0

  def exclude(self, what: str, since: float) -> float:
    """Leaves the seconds from `since` to now, spent on `what` ("eval" or
    "save"), out of training's time; returns them."""
    took = time.time() - since
    self.since += took
    self.spent[what] += took
    self.times[what] += 1
    return took

  def log_total(self, first: int, last: int) -> None:
    if last < first:
      return
    total = time.time() - self.start
    _log.info(
      "steps %d-%d took %s: evaluation %.1f s (%d), waiting for checkpoints %.1f s "
      "(%d saves), training and the rest %.1f s",
      first,
      last,
      values.hms(total),
      self.spent["eval"],
      self.times["eval"],
      self.spent["save"],
      self.times["save"],
      total - self.spent["eval"] - self.spent["save"],
    )


class MetricWindow:
  """The steps' metrics since the last log line, left on the device until a
  step must look at them (a log line, a save, an evaluation, the end).

  Each step's metrics (a dict of [S] arrays) are packed by one jitted call
  into a float32 [S, n] array, dispatched like the step and never waited
  for; `check()` brings every step not read yet to the host in one
  transfer and returns the first whose loss or gradient was not finite.
  So an ordinary step reads nothing from the device, and the loop runs
  ahead of it until the next step that checks.
  """

  def __init__(self) -> None:
    self.names: Optional[tuple[str, ...]] = None
    self._pack: Optional[jax.stages.Wrapped] = None
    self.steps: list[int] = []  # since the last log line
    self.pending: list[jax.Array] = []  # the newest len(pending) steps, not read yet
    self.rows: list[np.ndarray] = []  # the steps read: [S, n] each

  def add(self, step: int, metrics: dict[str, jax.Array]) -> None:
    if self._pack is None:
      names = self.names = tuple(sorted(metrics))
      self._pack = jax.jit(lambda m: jnp.stack([m[k].astype(jnp.float32) for k in names], axis=-1))
    self.steps.append(step)
    self.pending.append(self._pack(metrics))

  def check(self) -> Optional[int]:
    """Reads the unread steps (one transfer); the first non-finite step
    among them, or None."""
    if not self.pending:
      return None
    first = len(self.rows)
    self.rows.extend(np.asarray(jax.device_get(jnp.stack(self.pending))))
    self.pending = []
    assert self.names is not None  # set by add(), which every pending step came from
    finite = self.names.index("finite")
    for step, row in zip(self.steps[first:], self.rows[first:]):
      if not (row[:, finite] > 0).all():
        return step
    return None

  def take(self) -> dict[str, np.ndarray]:
    """The window's metrics, read (check() first), as {name: [steps, S]};
    the window starts again empty."""
    if self.pending:
      raise RuntimeError("take() before check(): steps of the window are not read yet")
    stacked = np.stack(self.rows)  # [steps, S, n]
    self.steps, self.rows = [], []
    assert self.names is not None  # rows were stacked: add() ran
    return {k: stacked[..., i] for i, k in enumerate(self.names)}


class MetricLog:
  """The steps' metrics between two log lines, aggregated into one record of
  the train metrics and one log line: loss and bits over every predicted
  token, the other metrics averaged over segments, the learning rate,
  throughput, MFU (where the devices' peak is known: not on CPU) and ETA.
  `end`: the run's last step (for the ETA). The FLOPs per token are those
  of one micro-batch's rows (TrainConfig.micro_batch_rows)."""

  def __init__(self, experiment: experiment_lib.Experiment, writer: MetricWriter, end: int):
    self.train, self.writer, self.end = experiment.train, writer, end
    self.bits_name = "bits_per_byte" if experiment.data.tokenizer == "bytes" else "bits_per_token"
    self.schedule = train_step.learning_rate_schedule(self.train)
    self.tokens_per_step = self.train.tokens_per_step
    self.train_flops = flops_lib.flops_per_token(
      experiment.model, self.train.micro_batch_rows
    ).train
    peak = flops_lib.device_peak_flops(experiment.model.dtype)
    self.peak = None if peak is None else peak * jax.device_count()

  def due(self, step: int) -> bool:
    return step % self.train.log_every_steps == 0 or step == self.train.num_train_steps

  def write(self, step: int, m: dict[str, np.ndarray], clock: Clock) -> None:
    """One record and log line of the window `m` ({name: [steps, S]}), which
    ends at `step`."""
    elapsed = time.time() - clock.since
    steps = clock.steps
    nats, count = float(m["nats"].sum()), max(float(m["tokens"].sum()), 1.0)
    # The rate of this step's last update (the optimizer's count before it).
    last_update = step * self.train.updates_per_step - 1
    scalars = {
      "loss": nats / count,
      self.bits_name: nats / count / losses.LN2,
      "reconstruction_loss": float(np.mean(m["reconstruction_loss"])),
      "grad_norm": float(np.mean(m["grad_norm"])),
      "learning_rate": float(self.schedule(last_update)),
      "tokens_per_second": steps * self.tokens_per_step / max(elapsed, 1e-9) if steps else 0.0,
    }
    mfu = ""
    if self.peak and steps:
      scalars["mfu"] = scalars["tokens_per_second"] * self.train_flops / self.peak
      mfu = f"  MFU {100 * scalars['mfu']:.1f}%"
    mass = [float(np.mean(m[f"attention_mass/{k}"])) for k in BANKS]
    # Fused rope attention computes no weights, so there is no mass to log
    # (the model reports NaN); leave the scalars out rather than log NaN.
    attn = "n/a"
    if all(np.isfinite(mass)):
      scalars.update({f"attention_mass/{k}": v for k, v in zip(BANKS, mass)})
      attn = "/".join(f"{v:.2f}" for v in mass)
    eta = (self.end - step) * elapsed / max(steps, 1) + remaining_pauses(
      self.train, step, self.end, clock
    )
    self.writer.write(step, scalars)
    _log.info(
      "step %d/%d  loss %.4f  %s %.4f  recon %.4g  attn c/m/s %s  %.0f tok/s%s  ETA %s",
      step,
      self.train.num_train_steps,
      scalars["loss"],
      self.bits_name,
      scalars[self.bits_name],
      scalars["reconstruction_loss"],
      attn,
      scalars["tokens_per_second"],
      mfu,
      values.hms(eta),
    )
    clock.restart()


def _due_after(every: int, step: int, end: int, also: int) -> int:
  """How many steps in (step, end] are multiples of `every` (none when 0) or
  are `also`."""
  count = end // every - step // every if every else 0
  return count + int(step < also <= end and not (every and also % every == 0))


def remaining_pauses(train: experiment_lib.TrainConfig, step: int, end: int, clock: Clock) -> float:
  """Seconds the run's evaluations and checkpoints after `step` (up to
  `end`) will take, at the mean of those this run has made (none yet: 0),
  for the ETA: they are left out of training's own time (Clock)."""
  total = 0.0
  for what, every, also in (
    ("eval", train.eval_every_steps, train.num_train_steps),
    ("save", train.checkpoint_every_steps, end),
  ):
    if clock.times[what]:
      total += _due_after(every, step, end, also) * clock.spent[what] / clock.times[what]
  return total


def truncate_metrics(path: str, step: int, public: Callable[[str], str] = str) -> None:
  """Drops log records written after the checkpoint a run resumes from (and
  any line a crash cut short), replacing the file at once; `public` names
  the path in a warning (truncate_jsonl)."""
  truncate_jsonl(path, step, public)


def finished(train: experiment_lib.TrainConfig, start: int, workdir: layout.Where) -> bool:
  """Whether the run restored at `start` has no step left (said in a line)."""
  if start < train.num_train_steps:
    return False
  _log.info(
    "the run is finished: step %d of %d is checkpointed in %s; nothing to train "
    "(a larger --config.num_train_steps trains on)",
    start,
    train.num_train_steps,
    layout.workdir(workdir).name,
  )
  return True


def log_start(
  experiment: experiment_lib.Experiment,
  workdir: layout.Where,
  num_params: int,
  start: int,
  end: int,
  config_name: str = "",
) -> None:
  """The run's config, size and files, before its first step (the mesh
  line, `_step_fn`'s, says where it runs)."""
  train, model = experiment.train, experiment.model
  segments = train.batch_size * train.segments_per_step
  _log.info(
    "%s%s parameters in %s; %s tokens per step (%d rows x %d segments x %d tokens); "
    "steps %d-%d of %d",
    f"config {config_name}: " if config_name else "",
    f"{num_params:,}",
    model.dtype,
    f"{segments * model.segment_length:,}",
    train.batch_size,
    train.segments_per_step,
    model.segment_length,
    start + 1,
    end,
    train.num_train_steps,
  )
  run = layout.workdir(workdir).absolute()
  board = (
    f"; TensorBoard: tensorboard --logdir {run.public(run.tensorboard())}"
    if writers.TENSORBOARD in train.metric_writers
    else ""
  )
  others = [w for w in train.metric_writers if w != writers.TENSORBOARD]
  _log.info(
    "the run's files: %s, %s, %s and %s%s%s",
    run.public(run.config),
    run.public(run.log),
    run.public(run.metrics("train")),
    run.public(run.metrics("eval")),
    board,
    f"; metrics also to {', '.join(others)}" if others else "",
  )


def warn_of_endless_warmup(train: experiment_lib.TrainConfig) -> None:
  """A warmup as long as the run: its last update's rate, the one the
  metrics log at the last step, is below the peak."""
  if train.optimizer.warmup_steps >= train.num_train_steps:
    last = float(
      train_step.learning_rate_schedule(train)(train.num_train_steps * train.updates_per_step - 1)
    )
    _log.warning(
      "optimizer.warmup_steps=%d >= num_train_steps=%d: the learning rate is still warming "
      "up when the run ends; its last update's is %.4g, below optimizer.learning_rate=%g",
      train.optimizer.warmup_steps,
      train.num_train_steps,
      last,
      train.optimizer.learning_rate,
    )
