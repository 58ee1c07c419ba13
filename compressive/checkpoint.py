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

import json
import os
from typing import Any, Optional

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"


def _manager(workdir: str, max_to_keep: Optional[int] = None, create: bool = True):
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create)
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR), options=options)


class Checkpointer:
  """Saves and restores (train state, memory, data position) by step."""

  def __init__(self, workdir: str, max_to_keep: Optional[int] = 3, create: bool = True):
    self._manager = _manager(workdir, max_to_keep, create)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, memory: Any, data_state: dict[str, np.ndarray]) -> None:
    """Every process calls this; each writes its shards of `state` and
    `memory`, and the primary process writes `data_state` (the iterator
    position of every batch row) as JSON."""
    data_json = {k: np.asarray(v).tolist() for k, v in data_state.items()}
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        memory=ocp.args.StandardSave(memory),
        data=ocp.args.JsonSave(data_json)))

  def restore(self, step: int, abstract_state: Any, abstract_memory: Any = None):
    """Returns (state, memory or None, data_state) of `step`.

    `abstract_*` give the structure, shapes, dtypes (and shardings) to restore
    into; pass `abstract_memory=None` to skip the memory (evaluation).
    """
    items = dict(state=ocp.args.StandardRestore(abstract_state),
                 data=ocp.args.JsonRestore())
    if abstract_memory is not None:
      items["memory"] = ocp.args.StandardRestore(abstract_memory)
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    data_state = {k: np.asarray(v, np.int64) for k, v in restored["data"].items()}
    memory = restored["memory"] if abstract_memory is not None else None
    return restored["state"], memory, data_state

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


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
