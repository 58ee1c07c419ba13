"""Training: train_and_evaluate(), the loop around the train step.

The train state and the jitted step are compressive/training/step.py's; this
module runs them: it validates the config, restores the newest checkpoint
(train state, memory and the data iterator's position, so a resumed run sees
exactly the batches and memories it would have; restore.py), steps, logs
metrics (runlog.py), checkpoints, estimates the evaluation loss every
`eval_every_steps` (eval_lib.evaluate; both at a step's end, run.py), and
stops on a non-finite loss without saving it (or on non-finite parameters,
which Checkpointer.save refuses to write).

Multi-process runs: each process reads only its own batch rows and
contributes them to a global batch; the processes exchange their iterator
positions so that a checkpoint holds every row, write checkpoints together,
and restore onto any mesh whose batch split divides the batch (setup.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from typing import Any, Callable, Iterator, Optional

import jax

from compressive import config as config_lib
from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive import files
from compressive.data import prefetch
from compressive.training import checkpoint as ckpt_lib
from compressive.training import (
  curves,
  integrity,
  interrupts,
  layout,
  runconfig,
  runlog,
  sidefiles,
  writers,
)
from compressive.training import lock as workdir_lock
from compressive.training import restore as restore_lib
from compressive.training import run as run_lib
from compressive.training import setup as setup_lib
from compressive.training import step as train_step
from compressive.training.metrics import MetricWriter

_log = logging.getLogger("compressive")


@dataclasses.dataclass(frozen=True)
class _Options:
  """train_and_evaluate's keyword arguments (documented there)."""

  stop_at_step: Optional[int]
  should_stop: Optional[Callable[[], bool]]
  restore_intact: bool
  profile_steps: Optional[tuple[int, int]]
  accept_changed_corpus: bool
  config_name: str = ""


def train_and_evaluate(
  experiment: experiment_lib.Experiment,
  workdir: layout.Where,
  *,
  stop_at_step: Optional[int] = None,
  should_stop: Optional[Callable[[], bool]] = None,
  restore_intact: bool = False,
  profile_steps: Optional[tuple[int, int]] = None,
  accept_changed_corpus: bool = False,
  config_name: str = "",
) -> dict[str, float]:
  """Trains (resuming from the workdir's latest checkpoint), evaluates.

  In a multi-process run every process calls this with the same arguments
  (after `jax.distributed.initialize`); process 0 alone writes the config,
  metrics and logs, and all processes write the checkpoints together.

  Args:
    experiment: the checked experiment (`config.check(config)` of a
      config file's ConfigDict, as train.py does).
    workdir: checkpoints, metrics and TensorBoard logs go here (shared by
      all processes): a path or a gs:// URL (a mirror of it is opened for
      the run, layout.opened), or the Workdir a caller opened.
    stop_at_step: return after this step (checkpointed) instead of running to
      `num_train_steps`; the schedule is unchanged (for tests and pauses).
    should_stop: polled after every step (e.g. set by a SIGTERM handler);
      when it returns True the step is checkpointed and training returns.
    restore_intact: if the newest checkpoint cannot be restored, resume from
      the newest one that can (instead of raising CheckpointError).
    profile_steps: (START, END): a JAX profiler trace of steps START..END
      (inclusive) into WORKDIR/profile (TensorBoard's profile tab, or
      Perfetto); steps this run does not make are not traced.
    accept_changed_corpus: resume even if the corpus's digest or the data
      config's generating fields differ from those the checkpoint was saved
      with (a warning instead of RunMismatchError).
    config_name: the config as the command line named it, for the start's
      first line (train.py's --config).

  Raises:
    NonFiniteError: a loss or gradient was not finite, or (found at a save)
      the parameters, optimizer state or memory were; nothing of that step
      is checkpointed, so the last good checkpoint stays the newest.

  Process 0 appends the "compressive" logger's lines to WORKDIR/train.log
  while this runs (a handler added here and removed on return).

  Returns:
    The last evaluation's metrics (or the last training metrics).
  """
  if not isinstance(workdir, layout.Workdir):  # another URL: before anything is made
    workdir = os.fspath(workdir)
    files.check_local(workdir, "a workdir", remote_ok=True)
  writers.resolve(experiment.train.metric_writers)  # a writer that cannot be had: before anything
  options = _Options(
    stop_at_step,
    should_stop,
    restore_intact,
    config_lib.profile_steps(profile_steps),
    accept_changed_corpus,
    config_name,
  )
  if isinstance(workdir, layout.Workdir):
    return _train_in(experiment, workdir, options)
  with layout.opened(workdir) as opened:  # gs://: in a local mirror of its files (remote.py)
    return _train_in(experiment, opened, options)


def _train_in(
  experiment: experiment_lib.Experiment, workdir: layout.Workdir, options: _Options
) -> dict[str, float]:
  """train_and_evaluate in the workdir `workdir` (a mirror's too)."""
  is_main = jax.process_index() == 0
  fresh = not os.path.lexists(workdir.root)
  os.makedirs(workdir.root, exist_ok=True)
  lock = workdir_lock.lock_workdir(workdir, is_main)
  log_file = None
  try:
    if is_main:  # a folder, link or FIFO in a side file's place never blocks a resume
      sidefiles.prepare(workdir)
    log_file = runlog.add_log_file(workdir) if is_main else None
    checkpointer = ckpt_lib.Checkpointer(workdir, max_to_keep=experiment.train.keep_checkpoints)
    try:
      result = _train(experiment, workdir, checkpointer, is_main, options)
    except BaseException:
      # Whatever ends the run (an exception, a second signal, a NaN): the
      # save in flight is finished before the error goes on, so no checkpoint
      # is left half-written and no Orbax thread outlives the process. A
      # failure of that save too is logged, and the first error reported.
      try:
        checkpointer.close()
      except Exception as e:
        _log.warning(
          "the checkpoint save in flight failed too: %s",
          str(e).splitlines()[0] if str(e) else type(e).__name__,
        )
      raise
    checkpointer.close()  # a failed last save is the run's error
    return result
  finally:
    started = is_main and os.path.lexists(workdir.config)
    if log_file is not None:
      _log.removeHandler(log_file)
      log_file.close()
    if lock is not None:
      lock.release()
    if fresh and is_main and not started:  # the run stopped before it began: leave no stub
      _remove_stub(workdir)


def _remove_stub(run: layout.Workdir) -> None:
  """Removes what a start that failed before the run began (config.json is
  written once the run is known to fit) made in the workdir it created: the
  lock file, an empty log, the checkpoints folder with nothing but its
  owner record, and the workdir itself when nothing else is there."""
  for path in (run.lock, run.log):
    if files.kind(path) == "file" and (path != run.log or not os.path.getsize(path)):
      os.remove(path)
  if files.kind(run.checkpoints) == "a folder":
    if set(os.listdir(run.checkpoints)) <= {layout.OWNER_FILE}:
      shutil.rmtree(run.checkpoints)
  for folder in (*reversed(run.side_folders), run.root):
    try:
      os.rmdir(folder)
    except OSError:
      pass  # not there, or not empty: kept


def _train(
  experiment: experiment_lib.Experiment,
  workdir: layout.Workdir,
  checkpointer: ckpt_lib.Checkpointer,
  is_main: bool,
  options: _Options,
) -> dict[str, float]:
  """Builds the run, restores its newest checkpoint (or starts afresh) and
  steps it; the last evaluation's metrics."""
  if checkpointer.all_steps():
    runconfig.check_resume_config(workdir, experiment)
  setup, train_iter, eval_docs, identity = _build(experiment)
  start, restored = _restore(experiment, workdir, checkpointer, setup, identity, is_main, options)
  if runlog.finished(experiment.train, start, workdir):
    _warn_of_a_changed_config(experiment, workdir, is_main)
    return {}
  runlog.warn_of_endless_warmup(experiment.train)
  with (
    _metric_writers(experiment, workdir, is_main) as (writer, eval_writer),
    runlog.Profiler(options.profile_steps, workdir.profile) as profiler,
  ):
    end = experiment.train.num_train_steps
    if options.stop_at_step is not None:
      end = min(options.stop_at_step, end)
    run = run_lib.Run(
      experiment,
      workdir,
      checkpointer,
      setup,
      identity,
      train_iter,
      eval_docs,
      writer,
      eval_writer,
      profiler,
      end,
      options.accept_changed_corpus,
    )
    _log_start(run, start, options.config_name)
    result = _steps(run, start, restored, is_main, options.should_stop)
  if is_main:  # from the metrics files, closed above
    curves.draw_at_the_end(workdir)
  return result


def _build(
  experiment: experiment_lib.Experiment,
) -> tuple[setup_lib.Setup, data_lib.SegmentIterator, Any, dict[str, Any]]:
  """(setup, training iterator, evaluation documents, run identity) of the
  run: its model, layout and data built, the identity a checkpoint is saved
  with and checked against (integrity.run_identity)."""
  data = experiment.data
  tokenizer = data_lib.get_tokenizer(data)  # its vocabulary fits: config.check
  setup = setup_lib.build_setup(experiment)
  train_iter, eval_docs = setup_lib.train_data(experiment, setup.layout, tokenizer)
  identity = integrity.run_identity(
    experiment.model,
    tokenizer.identity,
    data_lib.corpus_identity(data),
    data_lib.data_identity(data),
  )
  return setup, train_iter, eval_docs, identity


def _restore(
  experiment: experiment_lib.Experiment,
  workdir: layout.Workdir,
  checkpointer: ckpt_lib.Checkpointer,
  setup: setup_lib.Setup,
  identity: dict[str, Any],
  is_main: bool,
  options: _Options,
) -> tuple[int, Optional[restore_lib.Restored]]:
  """(start, restored): the newest checkpoint that restores (restore.py), or
  step 0 and None; the config recorded in the workdir once the run is known
  to fit what it holds."""
  start, restored = restore_lib.restore_newest(
    checkpointer,
    setup.restore_targets(),
    restore_intact=options.restore_intact,
    accept_changed_corpus=options.accept_changed_corpus,
    is_main=is_main,
    identity=identity,
  )
  finished = start >= experiment.train.num_train_steps
  # Only once the run is known to fit what the workdir holds; a finished
  # run's record stays as it was trained (written again only when it was
  # missing or set aside as damaged).
  if is_main and not (finished and os.path.lexists(workdir.config)):
    runconfig.save_config(workdir, experiment)
  return start, restored


def _warn_of_a_changed_config(
  experiment: experiment_lib.Experiment, workdir: layout.Workdir, is_main: bool
) -> None:
  """For a finished run: a warning (process 0) when this command's config
  differs from the one the run was trained with, which its record keeps."""
  changed = runconfig.differences(workdir, experiment) if is_main else []
  if changed:
    _log.warning(
      "this command's config differs from the finished run's (%s); %s keeps the "
      "values the run was trained with",
      "; ".join(changed[:4]),
      workdir.public(workdir.config),
    )


def _log_start(run: run_lib.Run, start: int, config_name: str) -> None:
  """The start's lines (runlog.log_start), and the data's: its documents
  for training and for the evaluation."""
  experiment = run.experiment
  runlog.log_start(experiment, run.workdir, run.setup.num_params, start, run.end, config_name)
  _log.info(
    "%s",
    data_lib.describe(
      experiment.data,
      {
        "train": len(run.train_iter.docs),
        f"{experiment.eval.split} (evaluated)": len(run.eval_docs),
      },
    ),
  )


@contextlib.contextmanager
def _metric_writers(
  experiment: experiment_lib.Experiment, workdir: layout.Workdir, is_main: bool
) -> Iterator[tuple[MetricWriter, MetricWriter]]:
  """(train, eval) MetricWriters, handing their records to the metric
  writers of experiment.train.metric_writers (writers.py), opened once for
  both on process 0 (given the config as hyperparameters) and closed after."""
  sinks = (
    writers.open_all(experiment.train.metric_writers, writers.run_of(workdir, experiment.to_dict()))
    if is_main
    else []
  )
  try:
    writer = MetricWriter(workdir, "train", enabled=is_main, sinks=sinks)
    eval_writer = MetricWriter(workdir, "eval", enabled=is_main, sinks=sinks)
    with contextlib.closing(writer), contextlib.closing(eval_writer):
      if is_main and hasattr(writer, "write_hparams"):
        writer.write_hparams(experiment.to_dict())
      yield writer, eval_writer
  finally:
    for sink in sinks:
      sink.close()


def _steps(
  run: run_lib.Run,
  start: int,
  restored: Optional[restore_lib.Restored],
  is_main: bool,
  should_stop: Optional[Callable[[], bool]],
) -> dict[str, float]:
  """Steps from `start` (the `restored` state, or a fresh one) to the run's
  end or a stop; the last evaluation's metrics."""
  state, memory, step_fn = run_lib.begin(run, start, restored, is_main)
  assert run.clock is not None and run.window is not None and run.metric_log is not None
  stop = interrupts.StopAgreement(run.experiment.train.checkpoint_every_steps, should_stop)
  step = start
  with _prefetcher(run) as batches:
    for step in range(start + 1, run.end + 1):
      run.profiler.before(step)  # the wait for the step's input included
      state, memory, metrics = step_fn(state, memory, next(batches))
      run.profiler.after(step, (state, memory, metrics))
      run.window.add(step, metrics)
      run.clock.stepped(step == start + 1)
      # An ordinary step ends here, having read nothing from the device:
      # the next one is dispatched while this one computes.
      stopping, saving, logging_, evaluating = _due(run, stop, step)
      if not (saving or logging_ or evaluating):
        continue
      bad = run.window.check()  # nothing non-finite is logged, saved or evaluated
      if bad is not None:
        del state, memory  # freed before the checkpoints are read back
        raise restore_lib.non_finite_error(
          bad, step, run.checkpointer, run.setup.restore_targets(), run.workdir
        )
      if logging_:
        run.metric_log.write(step, run.window.take(), run.clock)
      refused = run_lib.save(run, step, state, memory, batches.get_state()) if saving else None
      if evaluating and not refused:  # one process: a stop during it drops it, the step saved
        stopping = _estimate(run, state, step, should_stop)
        if stopping and not saving:
          refused = run_lib.save(run, step, state, memory, batches.get_state())
      if refused:  # a finite loss, but non-finite parameters: not saved
        del state, memory
        raise restore_lib.non_finite_error(
          step, step, run.checkpointer, run.setup.restore_targets(), run.workdir, refused
        )
      if stopping:
        _log.warning("stopping on request after step %d (checkpointed)", step)
        break
  run.clock.log_total(start + 1, step)
  return run.last_eval


def _prefetcher(run: run_lib.Run) -> prefetch.Prefetcher:
  """The run's step batches from its training iterator, train.prefetch_steps
  steps ahead (prefetch.py): what `_steps` steps through."""
  train = run.experiment.train
  return prefetch.Prefetcher(
    setup_lib.step_batches(train, run.setup.layout, run.train_iter), train.prefetch_steps
  )


def _due(
  run: run_lib.Run, stop: interrupts.StopAgreement, step: int
) -> tuple[bool, bool, bool, bool]:
  """(stopping, saving, logging, evaluating) at the end of `step`: whether
  to stop after it (`stop`: the same answer in every process), and whether
  it is to be checkpointed, its metrics logged, the evaluation estimated
  (not on a stop)."""
  train = run.experiment.train
  assert run.metric_log is not None  # run_lib.begin made it
  stopping = stop.requested(step)
  saving = run_lib.save_due(train, step, run.end, stopping)
  logging_ = run.metric_log.due(step)
  evaluating = run_lib.eval_due(train, step) and not stopping
  return stopping, saving, logging_, evaluating


def _estimate(
  run: run_lib.Run,
  state: train_step.TrainState,
  step: int,
  should_stop: Optional[Callable[[], bool]],
) -> bool:
  """Estimates the evaluation metrics after `step` (run_lib.estimate),
  kept as the run's last; True when a stop asked for during it dropped it
  (polled in a run of one process: several agree on a stop at a step's end)."""
  estimate = run_lib.estimate(run, state, step, should_stop if jax.process_count() == 1 else None)
  run.last_eval = estimate or run.last_eval
  return estimate is None
