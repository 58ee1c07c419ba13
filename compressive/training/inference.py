"""Model loading for inference: a training workdir's checkpoint as a model.

Evaluation, analysis, sampling and export read a workdir that a trainer may
still be writing: they take no lock and only read. A checkpoint holds the
whole train state (compressive/training/step.py), so its shapes come from the
config's model and optimizer; of what is read, the model keeps only the
parameters.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import jax
import ml_collections

from compressive.training import checkpoint as ckpt_lib
from compressive import data as data_lib
from compressive.scale import sharding
from compressive.training import step as train_step
from compressive.errors import UserError
from compressive.model.transformer import CompressiveTransformer, merge_params

_log = logging.getLogger("compressive")


def load(
    workdir: str, step: Optional[int] = None, *, config: Optional[ml_collections.ConfigDict] = None
) -> tuple[ml_collections.ConfigDict, CompressiveTransformer]:
  """(config, model) of a training workdir's latest (or given) checkpoint;
  see `load_with_step`."""
  config, model, _ = load_with_step(workdir, step, config=config)
  return config, model


def load_with_step(
    workdir: str, step: Optional[int] = None, *, config: Optional[ml_collections.ConfigDict] = None
) -> tuple[ml_collections.ConfigDict, CompressiveTransformer, int]:
  """(config, model, step) of a training workdir's latest (or given) checkpoint.

  `config` replaces the workdir's saved config (e.g. with other eval sizes,
  or another `mesh.shape` for this machine's devices); its model must match
  the checkpoint. The parameters are restored onto the config's mesh,
  whatever mesh wrote them; a saved config whose mesh does not fit this
  machine is loaded data parallel over all its devices instead.
  """
  if config is None:
    config = ckpt_lib.load_config(workdir)
    if sharding.fit_mesh_to_devices(config):
      _log.info("the saved mesh does not fit %d devices; loading onto mesh.shape=%s",
                jax.device_count(), config.mesh.shape)
  mesh = sharding.make_mesh(config)
  graphdef, state_template, abstract_params = train_step.abstract_model(config)
  tx = train_step.make_optimizer(config, abstract_params)
  abstract_state = train_step.abstract_train_state(config, abstract_params, tx)
  shardings = sharding.shardings(mesh, sharding.state_specs(config, state_template, abstract_state))
  identity = reader_identity(config)
  checkpointer = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    step, state = _restore_newest(checkpointer, step, ckpt_lib.abstract(abstract_state, shardings),
                                  identity)
  finally:
    checkpointer.close()
  model = merge_params(graphdef, state_template, state.params)
  model.eval()
  return config, model, step


def reader_identity(config: ml_collections.ConfigDict) -> dict:
  """The identity a reader compares with the one a checkpoint or export
  recorded: the model config, the tokenizer (when it can be built here) and
  the data config's generating fields. Not the corpus's content: a reader
  measures the corpus as it is."""
  return ckpt_lib.run_identity(config, _tokenizer_identity(config.data),
                               data=data_lib.data_identity(config.data))


def saved_identity(workdir: str, step: Optional[int] = None) -> tuple[str, Optional[dict]]:
  """(what it names, the identity recorded) of a workdir's checkpoint `step`
  (default the newest); the identity is None when none can be read now
  (missing, rotated away, damaged: the restore then says why)."""
  try:
    checkpointer = ckpt_lib.Checkpointer(workdir, read_only=True)
    try:
      step = checkpointer.latest_step() if step is None else step
      saved = checkpointer.record(step) if step is not None else None
    finally:
      checkpointer.close()
  except Exception:  # pylint: disable=broad-except
    return workdir, None
  identity = saved.get("identity") if isinstance(saved, dict) else None
  return f"checkpoint {checkpointer.step_dir(step)}", identity if isinstance(identity, dict) else None


def _tokenizer_identity(data_config: ml_collections.ConfigDict) -> Optional[str]:
  """The run's tokenizer's identity, to compare with the one its checkpoints
  recorded; None when the tokenizer cannot be built here (a SentencePiece
  model not on this machine: the tools that need it say so themselves)."""
  try:
    return data_lib.get_tokenizer(data_config).identity
  except (UserError, OSError):
    return None


def _restore_newest(checkpointer: ckpt_lib.Checkpointer, step: Optional[int], abstract_state,
                    identity, attempts: int = 20):
  """(step, train state) of `step`, or of the newest checkpoint: a reader takes
  no lock, so a running trainer may rotate the step away while it is read;
  then the steps are listed again and the newest is read instead."""
  for attempt in range(attempts):
    wanted = checkpointer.latest_step() if step is None else step
    if wanted is None:
      raise FileNotFoundError(f"no checkpoint in {os.path.dirname(checkpointer.directory)}")
    try:
      return wanted, checkpointer.restore(wanted, abstract_state, identity=identity)[0]
    except ckpt_lib.MissingStepError as e:
      if step is not None or attempt == attempts - 1:
        raise
      _log.info("checkpoint %d went away while it was read (%s); reading the newest", wanted, e)
      checkpointer.reload()
  raise AssertionError("unreachable")
