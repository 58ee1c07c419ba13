"""Model loading for inference: a training workdir's checkpoint as a model
(compressive/training/opening.py opens a workdir or an export with it).

Evaluation, analysis, sampling and export read a workdir that a trainer may
still be writing: they take no lock and only read. A checkpoint holds the
whole train state (compressive/training/step.py), so its shapes come from the
config's model and optimizer; of what is read, the model keeps only the
parameters.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

import jax

from compressive import config as config_lib
from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive.errors import UserError
from compressive.model.transformer import CompressiveTransformer, merge_params
from compressive.training import checkpoint as ckpt_lib
from compressive.training import integrity, layout, runconfig
from compressive.training import setup as setup_lib

_log = logging.getLogger("compressive")
# Seconds a reader goes on reading the newest checkpoint while a running
# trainer rotates away each one it reads (`_restore_newest`).
RACE_PATIENCE_S = 300.0


def saved_experiment(path: layout.Where) -> experiment_lib.Experiment:
  """The Experiment a run (workdir or export) at `path` is opened as when
  none is given: its saved config, refitted to this machine's devices when
  its mesh does not fit them, checked as a config read here
  (config.check_to_read)."""
  config = runconfig.load_config(path)
  if config_lib.fit_mesh_to_devices(config):
    _log.info(
      "the saved mesh does not fit %d devices; loading onto mesh.shape=%s",
      jax.device_count(),
      config.mesh.shape,
    )
  return config_lib.check_to_read(config)


def open_workdir(
  workdir: layout.Where, experiment: experiment_lib.Experiment, step: Optional[int] = None
) -> tuple[CompressiveTransformer, int]:
  """(model, step) of `workdir`'s checkpoint `step` (default the newest),
  restored onto the run's setup (setup.build_setup: the experiment's
  shapes on its mesh) and verified (checksums, finite values, identity)."""
  setup = setup_lib.build_setup(experiment)
  identity = reader_identity(experiment)
  checkpointer = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    step, state = _restore_newest(checkpointer, step, setup.restore_targets()[0], identity)
  finally:
    checkpointer.close()
  return model_of(setup, state.params), step


def model_of(setup: setup_lib.Setup, params: Any) -> CompressiveTransformer:
  """The model of a run's setup with `params`, in evaluation mode."""
  model = merge_params(setup.graphdef, setup.state_template, params)
  model.eval()
  return model


def reader_identity(experiment: experiment_lib.Experiment) -> dict:
  """The identity a reader compares with the one a checkpoint or export
  recorded, from the experiment it opens the run as: the model config, the
  tokenizer (when it can be built here) and the data config's generating
  fields. Not the corpus's content: a reader measures the corpus as it is."""
  return integrity.run_identity(
    experiment.model,
    _tokenizer_identity(experiment.data),
    data=data_lib.data_identity(experiment.data),
  )


def saved_identity(workdir: layout.Where, step: Optional[int] = None) -> tuple[str, Optional[dict]]:
  """(what it names, the identity recorded) of a workdir's checkpoint `step`
  (default the newest); the identity is None when no record can be read
  now (missing, rotated away, unparsable: the restore reads it again and
  then says why). A record read whole that lacks a field or holds a null
  where a check value belongs is damage now (DamagedCheckpointError), before
  anything else is read: a null never turns the comparison off."""
  try:
    checkpointer = ckpt_lib.Checkpointer(workdir, read_only=True)
    try:
      step = checkpointer.latest_step() if step is None else step
      saved = checkpointer.record(step) if step is not None else None
    finally:
      checkpointer.close()
  except Exception:
    return layout.workdir(workdir).name, None
  if saved is None:
    return layout.workdir(workdir).name, None
  assert step is not None  # a record was read, of this step
  ckpt_lib.integrity.check_record(checkpointer.step_dir(step), saved, checkpointer.advice)
  return f"checkpoint {checkpointer.step_dir(step)}", saved["identity"]


def _tokenizer_identity(data_config: data_lib.DataConfig) -> Optional[str]:
  """The identity of the tokenizer of `data_config` (the data section), to
  compare with the one its checkpoints recorded; None when the tokenizer
  cannot be built here (a SentencePiece model not on this machine: the
  tools that need it say so themselves)."""
  try:
    return data_lib.get_tokenizer(data_config).identity
  except (UserError, OSError):
    return None


def _restore_newest(
  checkpointer: ckpt_lib.Checkpointer,
  step: Optional[int],
  abstract_state: Any,
  identity: dict[str, Any],
  patience_s: float = RACE_PATIENCE_S,
) -> tuple[int, Any]:
  """(step, train state) of `step`, or of the newest checkpoint: a reader takes
  no lock, so a running trainer may rotate the step away while it is read;
  then the steps are listed again and the newest is read instead, as long
  as each newest is newer than the one that went (a trainer going on) and
  for up to `patience_s` seconds (a reader slower than one training step
  loses the race at some reads and wins it at others; under load, many in a
  row)."""
  give_up = time.monotonic() + patience_s
  gone = -1  # the newest step that went away while it was read
  while True:
    wanted = checkpointer.latest_step() if step is None else step
    if wanted is None:
      raise FileNotFoundError(f"no checkpoint in {os.path.dirname(checkpointer.directory)}")
    try:
      return wanted, checkpointer.restore(wanted, abstract_state, identity=identity)[0]
    except ckpt_lib.MissingStepError as e:
      if step is not None or wanted <= gone:  # asked for, or no trainer going on: no race
        raise
      gone = wanted
      if time.monotonic() > give_up:
        raise ckpt_lib.MissingStepError(
          f"{e}; each newer step went the same way for {patience_s:.0f} s: the trainer keeps "
          "its checkpoints for less time than this reader takes to read one (keep more of "
          "them: train.keep_checkpoints, or save less often)"
        ) from None
      _log.info("checkpoint %d went away while it was read (%s); reading the newest", wanted, e)
      checkpointer.reload()
