"""The one place that talks to Orbax.

A checkpoint holds, under one step: the train state (parameters, optimizer
state, update count, RNG), the training memory, and the data iterator's
position, so that a resumed run continues exactly where it stopped. Arrays are
global (jax.Array over the mesh): every process writes its own shards of the
same checkpoint, and a restore may target another mesh. The
experiment config is written beside the checkpoints as JSON (`config.json`)
so that `compressive.load(workdir)` can rebuild the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from compressive.errors import CheckpointError, ConfigError

CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"


def _manager(workdir: str, max_to_keep: Optional[int], create: bool, read_only: bool):
  if read_only:
    # Evaluation, sampling and analysis never write, delete or clean up
    # anything, even while a training run is saving into the same workdir.
    options = ocp.CheckpointManagerOptions(read_only=True, create=False)
  else:
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create)
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR), options=options)


class Checkpointer:
  """Saves and restores (train state, memory, data position) by step."""

  def __init__(self, workdir: str, max_to_keep: Optional[int] = 3, create: bool = True,
               read_only: bool = False):
    self.directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    self._manager = _manager(workdir, max_to_keep, create, read_only)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, memory: Any, data_state: dict[str, np.ndarray]) -> None:
    """Every process calls this; each writes its shards of `state` and
    `memory`, and the primary process writes `data_state` (the iterator
    position of every batch row) as JSON."""
    data_json = {k: np.asarray(v).tolist() for k, v in data_state.items()}
    items = dict(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_json))
    stored = _nonempty_fields(memory)
    if stored:  # a segment-local model has no memory to store
      items["memory"] = ocp.args.StandardSave(stored)
    self._manager.save(step, args=ocp.args.Composite(**items))

  def restore(self, step: int, abstract_state: Any, abstract_memory: Any = None):
    """Returns (state, memory or None, data_state) of `step`.

    `abstract_*` give the structure, shapes, dtypes (and shardings) to restore
    into; pass `abstract_memory=None` to skip the memory (evaluation).
    """
    items = dict(state=ocp.args.StandardRestore(abstract_state),
                 data=ocp.args.JsonRestore())
    if abstract_memory is not None and _nonempty_fields(abstract_memory):
      items["memory"] = ocp.args.StandardRestore(_nonempty_fields(abstract_memory))
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # Orbax / TensorStore raise many kinds on bad files
      raise CheckpointError(
          f"checkpoint {os.path.join(self.directory, str(step))} cannot be restored "
          f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); it may be "
          "truncated or corrupt: train.py --restore_intact resumes from the newest "
          "checkpoint that restores") from e
    data_state = {k: np.asarray(v, np.int64) for k, v in restored["data"].items()}
    memory = None
    if abstract_memory is not None:
      memory = _with_empty_fields(abstract_memory, restored.get("memory") or {})
    return restored["state"], memory, data_state

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _nonempty_fields(memory: Any) -> Any:
  """The memory's fields as a dict, without zero-size ones (a Transformer-XL
  has no compressed memory, a segment-local model no memory), which Orbax
  refuses to save."""
  if not dataclasses.is_dataclass(memory):
    return memory
  return {f.name: getattr(memory, f.name) for f in dataclasses.fields(memory)
          if np.prod(getattr(memory, f.name).shape) > 0}


def _with_empty_fields(abstract_memory: Any, restored: Any) -> Any:
  """Inverse of `_nonempty_fields`: the memory, zero-size fields recreated."""
  if not dataclasses.is_dataclass(abstract_memory):
    return restored
  fields = {}
  for f in dataclasses.fields(abstract_memory):
    if f.name in restored:
      fields[f.name] = restored[f.name]
    else:
      x = getattr(abstract_memory, f.name)
      sharding = getattr(x, "sharding", None)
      fields[f.name] = jax.jit(lambda x=x: jnp.zeros(x.shape, x.dtype), out_shardings=sharding)()
  return dataclasses.replace(abstract_memory, **fields)


def abstract(tree: Any, shardings: Any = None) -> Any:
  """Shape/dtype/sharding skeleton of a pytree, for restoring into.

  `tree` may hold arrays or ShapeDtypeStructs; `shardings` (a matching tree
  of jax.sharding.Sharding) is where the restored arrays go, which need not
  be the mesh that wrote them: Orbax reads each device's slice of the saved
  global arrays, so 8 devices restore onto 1 and 1 onto 8. Without
  `shardings`, the arrays' own shardings are kept.
  """
  if shardings is None:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, CONFIG_FILE)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(config.to_json(indent=2))
  os.replace(tmp, path)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: {workdir} is not a training workdir")
  with open(path) as f:
    values = json.load(f)
  return ml_collections.ConfigDict(_tuples(values))


def _tuples(value):
  """JSON turns tuples into lists; configs use tuples for fixed-size fields."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


# Config fields that fix the shapes of what a checkpoint holds (parameters,
# optimizer state, memory, data position): resuming with other values cannot
# work, and is reported by name.
SHAPE_FIELDS = (
    "model.vocab_size", "model.num_layers", "model.num_heads", "model.d_model", "model.d_ff",
    "model.memory_length", "model.compressed_memory_length", "model.compression",
    "model.compression_rate", "model.reconstruction_loss", "model.positions",
    "model.segment_length",
    "batch_size", "optimizer.name", "data.source", "data.tokenizer", "seed",
)


# Values a run saved before the field existed had.
_ADDED_FIELD_DEFAULTS = {"model.positions": "relative"}


def _get(config, dotted: str):
  value = config
  for part in dotted.split("."):
    value = value.get(part) if hasattr(value, "get") else None
  return value


def check_resume_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """ConfigError naming the fields that differ from the run being resumed."""
  if not os.path.exists(os.path.join(workdir, CONFIG_FILE)):
    return
  saved = load_config(workdir)

  def saved_value(name):
    value = _get(saved, name)
    return _ADDED_FIELD_DEFAULTS.get(name) if value is None else value

  diffs = [f"{name} {saved_value(name)!r} -> {_get(config, name)!r}"
           for name in SHAPE_FIELDS if saved_value(name) != _get(config, name)]
  if diffs:
    raise ConfigError(
        f"{workdir} holds checkpoints of a different run: " + "; ".join(diffs)
        + ". Use another --workdir, or the same values to resume")
