"""Where a run starts, and what it does with a checkpoint it cannot use.

`restore_newest`: the newest checkpoint that restores; with --restore_intact,
damaged ones are moved aside and older ones tried (a shape or run mismatch
is never skipped). `start_state`: the restored state with the data iterator
put back and the metrics logged after it dropped, or a fresh state.
`non_finite_error`: the error that stops a run at a non-finite loss or
gradient, naming the newest checkpoint that is actually intact and finite,
since none of the bad steps is saved.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import jax
from jax.experimental import multihost_utils
import numpy as np

from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive.errors import CheckpointError, NonFiniteError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import integrity, layout, runlog
from compressive.training import setup as setup_lib
from compressive.training import step as train_step
from compressive.training.metrics import MetricWriter

_log = logging.getLogger("compressive")
Restored = tuple[Any, Any, dict[str, np.ndarray]]  # a checkpoint's (state, memory, data state)


def restore_newest(
  checkpointer: ckpt_lib.Checkpointer,
  targets: tuple[Any, Any],
  *,
  restore_intact: bool,
  accept_changed_corpus: bool,
  is_main: bool,
  identity: dict[str, Any],
) -> tuple[int, Optional[Restored]]:
  """(step, (state, memory, data_state)) of the newest checkpoint that
  restores onto `targets` (abstract state and memory), or (0, None) when
  there is none.

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
  accept = ("corpus", "data") if accept_changed_corpus else ()
  skipped = []
  for step in reversed(steps):
    try:
      return step, checkpointer.restore(step, *targets, identity=identity, accept=accept)
    except integrity.DamagedCheckpointError as e:
      if not restore_intact:
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


def _nothing_restores(checkpointer: ckpt_lib.Checkpointer, skipped: list) -> str:
  return (
    f"no checkpoint in {checkpointer.directory} restores: steps {skipped} are damaged "
    f"and were moved to {checkpointer.skipped}; "
    "nothing was trained. Move them back to retry, or use another --workdir to start "
    "afresh"
  )


def non_finite_error(
  bad: int,
  step: int,
  checkpointer: ckpt_lib.Checkpointer,
  targets: tuple[Any, Any],
  workdir: layout.Workdir,
  arrays: Optional[list[str]] = None,
) -> NonFiniteError:
  """The error that stops a run at a non-finite loss or gradient of step
  `bad`, found after step `step` was dispatched, or (`arrays`: their names)
  at a save of step `bad` whose state held non-finite arrays while its loss
  and gradient were finite (Checkpointer.save refused it). No step from
  `bad` on is saved; it names the newest checkpoint that actually restores
  as intact and finite, not merely the newest saved."""
  good = newest_good_step(checkpointer, targets)
  where = (
    f"the newest intact checkpoint is step {good}"
    if good is not None
    else "no intact checkpoint is saved"
  )
  later = f" (found after step {step}; none from step {bad} on was saved)" if step > bad else ""
  if arrays:
    shown = ", ".join(arrays[:3]) + (", ..." if len(arrays) > 3 else "")
    return NonFiniteError(
      f"non-finite parameters or optimizer state at step {bad} ({shown}), though its loss "
      f"and gradient were finite: not saved; {where} in {workdir.name}. Lower "
      "optimizer.learning_rate or optimizer.weight_decay, or check the config's values"
    )
  return NonFiniteError(
    f"non-finite loss or gradient at step {bad}; {where} in {workdir.name}{later}. Lower "
    "optimizer.learning_rate or optimizer.grad_clip_norm, or check the data"
  )


def newest_good_step(
  checkpointer: ckpt_lib.Checkpointer, targets: tuple[Any, Any]
) -> Optional[int]:
  """The newest saved step that restores, verifies and is finite."""
  checkpointer.wait()
  checkpointer.reload()
  for step in reversed(checkpointer.all_steps()):
    try:
      checkpointer.restore(step, *targets)
      return step
    except CheckpointError as e:
      _log.warning("checkpoint %d is not usable: %s", step, e)
  return None


def start_state(
  experiment: experiment_lib.Experiment,
  setup: setup_lib.Setup,
  start: int,
  restored: Optional[Restored],
  train_iter: data_lib.SegmentIterator,
  writer: MetricWriter,
  is_main: bool,
  workdir: layout.Workdir,
  accept_changed_corpus: bool = False,
) -> train_step.Carry:
  """(state, memory) to train from: the restored ones, with the data iterator
  put back where they were saved (with `accept_changed_corpus`, at the next
  epoch when the corpus has another number of documents) and the metrics
  logged after them dropped; else fresh ones."""
  if restored is not None:
    state, memory, data_state = restored
    local = setup_lib.local_data_state(data_state, train_iter.row_start, train_iter.num_rows)
    train_iter.set_state(local, other_documents=accept_changed_corpus)
    saved_docs = int(np.asarray(local["num_documents"]))
    if saved_docs != len(train_iter.docs):
      _log.warning(
        "the training corpus has %d documents, not the %d it had at step %d: every "
        "row goes on at the start of its next epoch (--accept_changed_corpus)",
        len(train_iter.docs),
        saved_docs,
        start,
      )
    if is_main:  # the eval metrics' file too: a step's estimate follows its save
      for path in (writer.jsonl, workdir.metrics("eval")):
        runlog.truncate_metrics(path, start, workdir.public)
    _log.info("resumed from step %d in %s", start, workdir.name)
    return state, memory
  state = train_step.init_train_state(experiment, setup.tx, setup.layout)
  memory = train_step.init_sharded_memory(
    experiment.model, experiment.train.batch_size, setup.layout
  )
  _log.info("training from scratch in %s", workdir.name)
  return state, memory
