"""Training: train_and_evaluate(), the loop around the train step.

The train state and the jitted step are compressive/training/step.py's; this
module runs them: it validates the config, restores the newest checkpoint
(train state, memory and the data iterator's position, so a resumed run sees
exactly the batches and memories it would have), steps, logs metrics,
checkpoints, estimates the evaluation loss every `eval_every_steps`
(eval_lib.evaluate), and stops on a non-finite loss without saving it.

Multi-process runs: each process reads only its own batch rows and
contributes them to a global batch; the processes exchange their iterator
positions so that a checkpoint holds every row, write checkpoints together,
and restore onto any mesh whose batch split divides the batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from typing import Any, Callable, Optional

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from compressive import config as config_lib
from compressive.training import checkpoint as ckpt_lib
from compressive import data as data_lib
from compressive.data import prefetch
from compressive.evaluation import evaluate as eval_lib
from compressive.scale import flops as flops_lib
from compressive.training import interrupts
from compressive.model import losses
from compressive.model import memory as memory_lib
from compressive.scale import sharding
from compressive.training import step as train_step
from compressive.training import lock as workdir_lock
from compressive.errors import ConfigError
from compressive.errors import CheckpointError
from compressive.training.metrics import MetricWriter, read_jsonl, rewrite_jsonl
from compressive.model.transformer import BANKS, merge_params

_log = logging.getLogger("compressive")




















class NonFiniteError(RuntimeError):
  """Training produced a NaN or infinite loss or gradient."""


def train_and_evaluate(
    config: ml_collections.ConfigDict | config_lib.Experiment,
    workdir: str,
    *,
    stop_at_step: Optional[int] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    restore_intact: bool = False,
    profile_steps: Optional[tuple[int, int]] = None,
    accept_changed_corpus: bool = False,
) -> dict[str, float]:
  """Trains (resuming from the workdir's latest checkpoint), evaluates.

  In a multi-process run every process calls this with the same arguments
  (after `jax.distributed.initialize`); process 0 alone writes the config,
  metrics and logs, and all processes write the checkpoints together.

  Args:
    config: the experiment config (configs/*.py), checked (an Experiment:
      config.check's) or to be checked here.
    workdir: checkpoints, metrics and TensorBoard logs go here (shared by
      all processes).
    stop_at_step: return after this step (checkpointed) instead of running to
      `num_train_steps`; the schedule is unchanged (for tests and pauses).
    should_stop: polled after every step (e.g. set by a SIGTERM handler);
      when it returns True the step is checkpointed and training returns.
    restore_intact: if the newest checkpoint cannot be restored, resume from
      the newest one that can (instead of raising CheckpointError).
    profile_steps: (START, END): a JAX profiler trace of steps START..END
      (inclusive) into WORKDIR/profile (TensorBoard's profile tab, or
      Perfetto); steps this run does not make are not traced.
    accept_changed_corpus: resume even if the corpus's digest differs from
      the one the checkpoint was saved with (a warning instead of
      RunMismatchError).

  Raises:
    NonFiniteError: a loss or gradient was not finite; nothing of that step
      is checkpointed, so the last good checkpoint stays the newest.

  Process 0 appends the "compressive" logger's lines to WORKDIR/train.log
  while this runs (a handler added here and removed on return).

  Returns:
    The last evaluation's metrics (or the last training metrics).
  """
  config = config_lib.experiment_of(config).config
  options = _Options(stop_at_step, should_stop, restore_intact,
                     config_lib.profile_steps(profile_steps), accept_changed_corpus)
  is_main = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  lock = _lock_workdir(workdir, is_main)
  log_file = None
  try:
    log_file = _add_log_file(workdir) if is_main else None
    checkpointer = ckpt_lib.Checkpointer(workdir, max_to_keep=config.keep_checkpoints)
    try:
      result = _train(config, workdir, checkpointer, is_main, options)
    except BaseException:
      # Whatever ends the run (an exception, a second signal, a NaN): the
      # save in flight is finished before the error goes on, so no checkpoint
      # is left half-written and no Orbax thread outlives the process. A
      # failure of that save too is logged, and the first error reported.
      try:
        checkpointer.close()
      except Exception as e:  # pylint: disable=broad-except
        _log.warning("the checkpoint save in flight failed too: %s",
                     str(e).splitlines()[0] if str(e) else type(e).__name__)
      raise
    checkpointer.close()  # a failed last save is the run's error
    return result
  finally:
    if log_file is not None:
      _log.removeHandler(log_file)
      log_file.close()
    if lock is not None:
      lock.release()


@dataclasses.dataclass(frozen=True)
class _Options:
  """train_and_evaluate's keyword arguments (documented there)."""
  stop_at_step: Optional[int]
  should_stop: Optional[Callable[[], bool]]
  restore_intact: bool
  profile_steps: Optional[tuple[int, int]]
  accept_changed_corpus: bool


LOG_FILE = "train.log"


class _LogFile(logging.FileHandler):
  """WORKDIR/train.log: appends the logger's lines. A write that fails (a
  full disk) stops the file with one warning instead of printing logging's
  traceback for every line; the console keeps the log."""

  def handleError(self, record):
    if getattr(self, "_failed", False):
      return
    self._failed = True
    import sys  # pylint: disable=g-import-not-at-top
    e = sys.exc_info()[1]
    why = getattr(e, "strerror", None) or str(e) or type(e).__name__
    print(f"warning: cannot write {self.baseFilename} ({why}); the log goes on on the console only",
          file=sys.stderr)

  def emit(self, record):
    if not getattr(self, "_failed", False):
      super().emit(record)


def _add_log_file(workdir: str) -> Optional[logging.Handler]:
  """Adds WORKDIR/train.log to the "compressive" logger; None if this process
  already logs to that file (a call within a call must not double lines)."""
  path = os.path.abspath(os.path.join(workdir, LOG_FILE))
  if any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in _log.handlers):
    return None
  handler = _LogFile(path, mode="a", encoding="utf-8")
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  _log.addHandler(handler)
  return handler




def hyperparameters(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config flattened for MetricWriter.write_hparams: dotted keys, values
  bool / int / float / str (tuples, lists, None and the rest as str)."""
  flat: dict[str, Any] = {}

  def visit(prefix: str, value):
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      for k, v in value.items():
        visit(f"{prefix}{k}.", v)
    elif isinstance(value, (bool, int, float, str)):
      flat[prefix[:-1]] = value
    else:
      flat[prefix[:-1]] = str(value)

  visit("", config.to_dict() if hasattr(config, "to_dict") else config)
  return flat


def _lock_workdir(workdir: str, is_main: bool):
  """Process 0 takes the workdir's lock; every process learns whether it could."""
  lock, busy = None, None
  if is_main:
    try:
      lock = workdir_lock.WorkdirLock(workdir).acquire()
    except workdir_lock.WorkdirBusyError as e:
      busy = e
  if _agree(busy is not None):
    raise busy or workdir_lock.WorkdirBusyError(
        f"{workdir} is in use by another trainer (process 0 could not lock it)")
  return lock


@dataclasses.dataclass(frozen=True)
class _Setup:
  """What a run builds before its first step: shapes and shardings, no arrays."""
  graphdef: Any
  state_template: Any
  tx: optax.GradientTransformation
  abstract_state: train_step.TrainState
  abstract_memory: Any
  layout: train_step.Layout
  num_params: int

  def restore_targets(self) -> tuple[Any, Any]:
    """The abstract (state, memory) a checkpoint restores onto: this run's
    shapes on this run's mesh, whatever mesh wrote the checkpoint."""
    return (ckpt_lib.abstract(self.abstract_state, self.layout.state),
            ckpt_lib.abstract(self.abstract_memory, self.layout.memory))


def build_setup(config: ml_collections.ConfigDict, mesh: Optional[jax.sharding.Mesh] = None) -> _Setup:
  """Shapes and layout of training on `mesh` (default: the config's mesh over
  this run's devices; aot.py passes a target's). Nothing is allocated."""
  mesh = sharding.make_mesh(config) if mesh is None else mesh
  graphdef, state_template, abstract_params = train_step.abstract_model(config)
  tx = train_step.make_optimizer(config, abstract_params)
  abstract_state = train_step.abstract_train_state(config, abstract_params, tx)
  dtype = jnp.dtype(config.model.dtype)
  abstract_memory = jax.eval_shape(
      lambda: memory_lib.init_memory(config.model, config.batch_size, dtype))
  return _Setup(
      graphdef=graphdef, state_template=state_template, tx=tx, abstract_state=abstract_state,
      abstract_memory=abstract_memory,
      layout=train_step.make_layout(config, mesh, state_template, abstract_state, abstract_memory),
      num_params=sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params)))


def _restore(checkpointer, setup: _Setup, options: _Options, is_main: bool, identity):
  """(step, (state, memory, data_state)) of the newest checkpoint that
  restores, or (0, None) when there is none.

  Without `restore_intact` any failure stops the run. With it, damaged
  checkpoints are moved aside into checkpoints/skipped/ (so that rotation
  never deletes them) and the next older one is tried; a shape or run
  mismatch is never skipped, and if every checkpoint is damaged the run
  stops rather than train from scratch over them; so does every later run
  while skipped/ holds steps and nothing intact is left (a retry of the
  same command stops the same way, and no new step takes a skipped one's
  name).
  """
  steps = checkpointer.all_steps()
  if not steps:
    aside = checkpointer.skipped_steps()
    if aside:
      raise CheckpointError(_nothing_restores(checkpointer, aside))
    return 0, None
  accept = ("corpus",) if options.accept_changed_corpus else ()
  skipped = []
  for step in reversed(steps):
    try:
      return step, checkpointer.restore(step, *setup.restore_targets(), identity=identity,
                                        accept=accept)
    except ckpt_lib.DamagedCheckpointError as e:
      if not options.restore_intact:
        raise
      _log.warning("skipping checkpoint %d: %s", step, e)
      skipped.append(step)
      if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"restore_intact_{step}")
      if is_main:
        _log.warning("moved damaged checkpoint %d to %s", step, checkpointer.move_aside(step))
      if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"moved_{step}")
      checkpointer.reload()
  raise CheckpointError(_nothing_restores(checkpointer, skipped))


def _nothing_restores(checkpointer, skipped: list) -> str:
  return (f"no checkpoint in {checkpointer.directory} restores: steps {skipped} are damaged "
          f"and were moved to {os.path.join(checkpointer.directory, ckpt_lib.SKIPPED_DIR)}; "
          "nothing was trained. Move them back to retry, or use another --workdir to start "
          "afresh")


def _start(config, setup: _Setup, start: int, restored, train_iter: data_lib.SegmentIterator,
           writer: MetricWriter, is_main: bool, workdir: str):
  """(state, memory) to train from: the restored ones, with the data iterator
  put back where they were saved and the metrics logged after them dropped;
  else fresh ones."""
  if restored is not None:
    state, memory, data_state = restored
    train_iter.set_state(_local_data_state(data_state, train_iter.row_start, train_iter.num_rows))
    if is_main:  # the eval metrics' file too: a step's estimate follows its save
      for path in (writer.jsonl, os.path.join(workdir, "metrics_eval.jsonl")):
        _truncate_metrics(path, start)
    _log.info("resumed from step %d in %s", start, workdir)
    return state, memory
  state = train_step.init_train_state(config, setup.tx, setup.layout)
  memory = train_step.init_sharded_memory(config, config.batch_size, setup.layout)
  _log.info("training from scratch in %s: %d parameters", workdir, setup.num_params)
  return state, memory


def _non_finite_error(bad: int, step: int, checkpointer, setup: _Setup,
                      workdir: str) -> NonFiniteError:
  """The error that stops a run at a non-finite loss or gradient of step
  `bad`, found after step `step` was dispatched. No step from `bad` on is
  saved; it names the newest checkpoint that actually restores as intact
  and finite, not merely the newest saved."""
  good = _newest_good_step(checkpointer, setup)
  where = (f"the newest intact checkpoint is step {good}" if good is not None
           else "no intact checkpoint is saved")
  later = f" (found after step {step}; none from step {bad} on was saved)" if step > bad else ""
  return NonFiniteError(
      f"non-finite loss or gradient at step {bad}; {where} in {workdir}{later}. Lower "
      "optimizer.learning_rate or optimizer.grad_clip_norm, or check the data")


def _newest_good_step(checkpointer, setup: _Setup) -> Optional[int]:
  """The newest saved step that restores, verifies and is finite."""
  checkpointer.wait()
  checkpointer.reload()
  for step in reversed(checkpointer.all_steps()):
    try:
      checkpointer.restore(step, *setup.restore_targets())
      return step
    except CheckpointError as e:
      _log.warning("checkpoint %d is not usable: %s", step, e)
  return None


def _train_data(config, layout: train_step.Layout, tokenizer):
  """(train iterator over this process's batch rows, evaluation documents)."""
  s, b, t = config.segments_per_step, config.batch_size, config.model.segment_length
  # This process reads only the batch rows its devices hold.
  row_start, num_rows = sharding.local_rows(layout.batch["inputs"], (s, b, t), axis=1)
  train_docs = data_lib.get_documents(config.data, "train", tokenizer)
  train_iter = data_lib.SegmentIterator(
      train_docs, batch_size=b, segment_length=t, seed=config.seed, repeat=True,
      row_start=row_start, num_rows=num_rows)
  eval_docs = data_lib.get_documents(config.data, config.eval.split, tokenizer)
  # Every document readable, decodable and long enough, before anything
  # compiles (a text_files corpus is otherwise read lazily, row by row).
  for split in dict.fromkeys(("train", config.eval.split)):
    data_lib.check_documents(config.data, split, tokenizer)
  return train_iter, eval_docs


def _step_batches(config, layout: train_step.Layout, train_iter: data_lib.SegmentIterator
                  ) -> prefetch.StepIterator:
  """Each step's global batch [S, B, ...], of which this process makes its
  rows and transfers them to the batch sharding (in the prefetch thread)."""
  s, b = config.segments_per_step, config.batch_size

  def to_device(local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    return {k: sharding.global_array(layout.batch[k], v, (s, b) + v.shape[2:])
            for k, v in local.items()}

  return prefetch.StepIterator(train_iter, s, put=to_device)


class _Clock:
  """Training's own wall time, for throughput and the ETA: the first step's
  compilation, checkpoint waits and evaluations are left out of it, and
  totalled for the run's closing line."""

  def __init__(self):
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
        "(%d saves), training and the rest %.1f s", first, last, eval_lib.hms(total),
        self.spent["eval"], self.times["eval"], self.spent["save"], self.times["save"],
        total - self.spent["eval"] - self.spent["save"])


class _MetricWindow:
  """The steps' metrics since the last log line, left on the device until a
  step must look at them (a log line, a save, an evaluation, the end).

  Each step's metrics (a dict of [S] arrays) are packed by one jitted call
  into a float32 [S, n] array, dispatched like the step and never waited
  for; `check()` brings every step not read yet to the host in one
  transfer and returns the first whose loss or gradient was not finite.
  So an ordinary step reads nothing from the device, and the loop runs
  ahead of it until the next step that checks.
  """

  def __init__(self):
    self.names: Optional[tuple[str, ...]] = None
    self._pack = None
    self.steps: list[int] = []  # since the last log line
    self.pending: list[jax.Array] = []  # the newest len(pending) steps, not read yet
    self.rows: list[np.ndarray] = []  # the steps read: [S, n] each

  def add(self, step: int, metrics: dict[str, jax.Array]) -> None:
    if self._pack is None:
      self.names = tuple(sorted(metrics))
      self._pack = jax.jit(lambda m: jnp.stack(
          [m[k].astype(jnp.float32) for k in self.names], axis=-1))
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
    return {k: stacked[..., i] for i, k in enumerate(self.names)}


class _MetricLog:
  """The steps' metrics between two log lines, aggregated into one record of
  the train metrics and one log line: loss and bits over every predicted
  token, the other metrics averaged over segments, the learning rate,
  throughput, MFU (where the devices' peak is known: not on CPU) and ETA."""

  def __init__(self, config: ml_collections.ConfigDict, writer: MetricWriter, end: int):
    self.config, self.writer, self.end = config, writer, end
    self.bits_name = "bits_per_byte" if config.data.tokenizer == "bytes" else "bits_per_token"
    self.schedule = train_step.learning_rate_schedule(config)
    b = config.batch_size
    self.tokens_per_step = config.segments_per_step * b * config.model.segment_length
    self.train_flops = flops_lib.flops_per_token(config.model, b // config_lib.grad_accum_steps(config)).train
    peak = flops_lib.device_peak_flops(config.model.dtype)
    self.peak = None if peak is None else peak * jax.device_count()

  def due(self, step: int) -> bool:
    return step % self.config.log_every_steps == 0 or step == self.config.num_train_steps

  def write(self, step: int, m: dict[str, np.ndarray], clock: _Clock) -> None:
    """One record and log line of the window `m` ({name: [steps, S]}), which
    ends at `step`."""
    elapsed = time.time() - clock.since
    steps = clock.steps
    nats, count = float(m["nats"].sum()), max(float(m["tokens"].sum()), 1.0)
    updates = step * self.config.segments_per_step  # the optimizer's count after this step
    scalars = {
        "loss": nats / count,
        self.bits_name: nats / count / losses.LN2,
        "reconstruction_loss": float(np.mean(m["reconstruction_loss"])),
        "grad_norm": float(np.mean(m["grad_norm"])),
        "learning_rate": float(self.schedule(updates)),
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
    eta = (self.end - step) * elapsed / max(steps, 1)
    self.writer.write(step, scalars)
    _log.info(
        "step %d/%d  loss %.4f  %s %.4f  recon %.4g  attn c/m/s %s  %.0f tok/s%s  ETA %s",
        step, self.config.num_train_steps, scalars["loss"], self.bits_name,
        scalars[self.bits_name], scalars["reconstruction_loss"], attn,
        scalars["tokens_per_second"], mfu, eval_lib.hms(eta))
    clock.restart()


def _save_due(config, step: int, end: int, stopping: bool) -> bool:
  every = config.checkpoint_every_steps
  return stopping or step == end or bool(every and step % every == 0)


def _save(checkpointer, step: int, state, memory, data_state, train_iter, identity,
          clock: _Clock) -> None:
  """Checkpoints the step with `data_state`, the position after the batches
  consumed (not those prefetched), and the run's identity; training waits
  only until the save is under way."""
  t_save = time.time()
  checkpointer.save(step, state, memory, _global_data_state(data_state, train_iter), identity)
  took = clock.exclude("save", t_save)
  _log.info("checkpoint of step %d: training waited %.1f s (the rest is written "
            "in the background)", step, took)


def _eval_due(config, step: int) -> bool:
  every = config.eval_every_steps
  return bool(every and step % every == 0) or step == config.num_train_steps


def _estimate(config, setup: _Setup, state, eval_docs, step: int, eval_writer: MetricWriter,
              clock: _Clock) -> dict[str, float]:
  """A quick estimate of the evaluation metrics, written to the eval metrics
  (eval.max_segments per row; <= 0 for the whole split): eval.py evaluates
  whole splits."""
  t_eval = time.time()
  model = merge_params(setup.graphdef, setup.state_template, state.params)
  result = eval_lib.evaluate(
      model, eval_docs, config, max_segments=config.eval.max_segments, mesh=setup.layout.mesh)
  eval_writer.write(step, result)
  took = clock.exclude("eval", t_eval)
  _log.info("eval at step %d on %s: %s  (%.1f s)", step, config.eval.split,
            "  ".join(f"{k} {v:.4f}" for k, v in result.items()), took)
  return result


def _warn_of_endless_warmup(config) -> None:
  if config.optimizer.warmup_steps >= config.num_train_steps:
    _log.warning(
        "optimizer.warmup_steps=%d >= num_train_steps=%d: the learning rate is still warming "
        "up when the run ends and never reaches optimizer.learning_rate=%g",
        config.optimizer.warmup_steps, config.num_train_steps, config.optimizer.learning_rate)


def _train(config, workdir, checkpointer, is_main, options: _Options) -> dict[str, float]:
  if checkpointer.all_steps():
    ckpt_lib.check_resume_config(workdir, config)
  tokenizer = data_lib.get_tokenizer(config.data)
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
        f"vocabulary ({tokenizer.vocab_size})")
  setup = build_setup(config)
  layout = setup.layout
  train_iter, eval_docs = _train_data(config, layout, tokenizer)
  identity = ckpt_lib.run_identity(config, tokenizer.identity,
                                   data_lib.corpus_identity(config.data))

  start, restored = _restore(checkpointer, setup, options, is_main, identity)
  if is_main:  # only once the run is known to fit what the workdir holds
    ckpt_lib.save_config(workdir, config)
  _warn_of_endless_warmup(config)
  writer = MetricWriter(workdir, "train", enabled=is_main)
  eval_writer = MetricWriter(workdir, "eval", enabled=is_main)
  with contextlib.closing(writer), contextlib.closing(eval_writer), \
      _Profiler(options.profile_steps, os.path.join(workdir, "profile")) as profiler:
    if is_main and hasattr(writer, "write_hparams"):
      writer.write_hparams(hyperparameters(config))
    state, memory = _start(config, setup, start, restored, train_iter, writer, is_main, workdir)
    _log.info("mesh %s over %d devices in %d processes; this process reads rows [%d, %d)",
              dict(layout.mesh.shape), layout.mesh.size, jax.process_count(),
              train_iter.row_start, train_iter.row_start + train_iter.num_rows)
    accum = config_lib.grad_accum_steps(config)
    if accum > 1:
      _log.info("accumulating gradients over %d micro-batches of %d rows", accum,
                config.batch_size // accum)

    step_fn = train_step.make_train_step(
        setup.graphdef, setup.state_template, setup.tx, config.model.dropout_rate > 0, layout,
        grad_accum_steps=accum)
    end = config.num_train_steps
    if options.stop_at_step is not None:
      end = min(options.stop_at_step, end)
    clock, metric_log, window = _Clock(), _MetricLog(config, writer, end), _MetricWindow()
    stop = _StopAgreement(config, options.should_stop)
    last_eval: dict[str, float] = {}
    step = start
    with prefetch.Prefetcher(_step_batches(config, layout, train_iter),
                             config.prefetch_steps) as batches:
      for step in range(start + 1, end + 1):
        profiler.before(step)  # the wait for the step's input included
        state, memory, metrics = step_fn(state, memory, next(batches))
        profiler.after(step, (state, memory, metrics))
        window.add(step, metrics)
        clock.stepped(step == start + 1)
        # An ordinary step ends here, having read nothing from the device:
        # the next one is dispatched while this one computes.
        stopping = stop.requested(step)
        saving, logging_ = _save_due(config, step, end, stopping), metric_log.due(step)
        evaluating = _eval_due(config, step) and not stopping
        if not (saving or logging_ or evaluating):
          continue
        bad = window.check()  # nothing non-finite is logged, saved or evaluated
        if bad is not None:
          del state, memory  # freed before the checkpoints are read back
          raise _non_finite_error(bad, step, checkpointer, setup, workdir)
        if logging_:
          metric_log.write(step, window.take(), clock)
        if saving:
          _save(checkpointer, step, state, memory, batches.get_state(), train_iter, identity,
                clock)
        if stopping:
          _log.warning("stopping on request after step %d (checkpointed)", step)
          break
        if evaluating:
          last_eval = _estimate(config, setup, state, eval_docs, step, eval_writer, clock)
    clock.log_total(start + 1, step)
    return last_eval


class _StopAgreement:
  """Whether to stop after a step, the same answer in every process.

  One process: `should_stop()`, a flag the host sets (a signal handler),
  polled every step. Several: a preemption notice (SIGTERM to any process)
  reaches every process through JAX's preemption service, which agrees on
  the step to stop at without a collective per step
  (`multihost_utils.reached_preemption_sync_point`, polled every step: a
  local check until a notice arrives); a request that comes another way
  (`should_stop` alone) is agreed at the next checkpoint step, where the
  processes meet anyway. Without the preemption service
  (`jax_enable_preemption_service=False`) every request waits for that.
  """

  def __init__(self, config, should_stop: Optional[Callable[[], bool]]):
    self.config, self.should_stop = config, should_stop
    self.processes = jax.process_count()

  def requested(self, step: int) -> bool:
    local = self.should_stop is not None and self.should_stop()
    if self.processes == 1:
      return local
    if interrupts.preemption_service() and multihost_utils.reached_preemption_sync_point(step):
      return True
    every = self.config.checkpoint_every_steps
    if every and step % every == 0:
      return _agree(local)
    return False


class _Profiler:
  """A JAX profiler trace of steps START..END (inclusive): started before
  the first of them this run makes, stopped once END's results are ready;
  stopped too if the run ends inside the range (an error, a stop request)."""

  def __init__(self, steps: Optional[tuple[int, int]], logdir: str):
    self.steps, self.logdir, self.tracing, self.done = steps, logdir, False, False

  def __enter__(self) -> "_Profiler":
    return self

  def before(self, step: int) -> None:
    if self.steps and not (self.tracing or self.done) and self.steps[0] <= step <= self.steps[1]:
      jax.profiler.start_trace(self.logdir)
      self.tracing = True
      _log.info("profiling steps %d-%d into %s", step, self.steps[1], self.logdir)

  def after(self, step: int, outputs) -> None:
    if self.tracing and step >= self.steps[1]:
      jax.block_until_ready(outputs)
      self._stop()
      _log.info("profile of steps up to %d written to %s", step, self.logdir)

  def _stop(self) -> None:
    self.tracing, self.done = False, True
    jax.profiler.stop_trace()

  def __exit__(self, *exc) -> None:
    if self.tracing:
      try:
        self._stop()
      except Exception as e:  # pylint: disable=broad-except
        if exc[0] is None:
          raise
        _log.warning("the profile trace could not be written: %s", e)


def _agree(flag: bool) -> bool:
  """True when any process says so, so that every process stops at one step."""
  if jax.process_count() == 1:
    return flag
  return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


_ROW_KEYS = ("epoch", "position", "offset")


def _global_data_state(state: dict[str, np.ndarray], it: data_lib.SegmentIterator
                       ) -> dict[str, np.ndarray]:
  """The iterator position `state` of this process's rows (from `it`) as that
  of ALL batch rows, one process-independent dict.

  Each process knows only its own rows (compressive/data/iterator.py); they
  are exchanged so that the checkpoint holds every row and restores onto any
  number of processes (each takes its rows back, `_local_data_state`).
  """
  state = dict(state)
  if jax.process_count() == 1:
    return state
  rows = np.stack([state[k] for k in _ROW_KEYS]).astype(np.int32)  # [3, rows]
  starts = np.asarray(multihost_utils.process_allgather(np.int32(it.row_start)))  # [P]
  every = np.asarray(multihost_utils.process_allgather(rows))  # [P, 3, rows]
  full = np.full([3, it.batch_size], -1, np.int64)
  for p in range(every.shape[0]):
    full[:, starts[p]:starts[p] + it.num_rows] = every[p]
  if (full < 0).any():
    raise RuntimeError("the processes' batch rows do not cover the global batch")
  state.update({k: full[i] for i, k in enumerate(_ROW_KEYS)})
  state["row_start"] = np.asarray(0, np.int64)
  state["num_rows"] = np.asarray(it.batch_size, np.int64)
  return state


def _local_data_state(state: dict[str, np.ndarray], row_start: int, num_rows: int) -> dict[str, np.ndarray]:
  """This process's rows of a checkpoint's (all-row) iterator state."""
  saved_rows = len(np.asarray(state["epoch"]).reshape(-1))
  if int(state.get("row_start", 0)) != 0 or int(state.get("num_rows", saved_rows)) != saved_rows:
    raise ValueError("the checkpoint's iterator state does not hold every batch row")
  local = dict(state)
  for k in _ROW_KEYS:
    local[k] = np.asarray(state[k], np.int64).reshape(-1)[row_start:row_start + num_rows]
  local["row_start"] = np.asarray(row_start, np.int64)
  local["num_rows"] = np.asarray(num_rows, np.int64)
  return local


def _truncate_metrics(path: str, step: int) -> None:
  """Drops log records written after the checkpoint a run resumes from (and
  any line a crash cut short), replacing the file at once."""
  if os.path.exists(path):
    rewrite_jsonl(path, [r for r in read_jsonl(path) if r["step"] <= step])
