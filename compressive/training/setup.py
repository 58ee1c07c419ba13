"""What a training run builds before its first step: the shapes and layout of
its state and memory on the mesh (no arrays), its data, and the data
position a checkpoint holds.

Multi-process runs: each process reads only its own batch rows and
contributes them to a global batch; the processes exchange their iterator
positions so that a checkpoint holds every row (`global_data_state`), and
each takes its rows back on restore, onto any mesh whose batch split
divides the batch (`local_data_state`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import optax

from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive.data import prefetch
from compressive.model import memory as memory_lib
from compressive.scale import sharding
from compressive.training import step as train_step
from compressive.training import trees


@dataclasses.dataclass(frozen=True)
class Setup:
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
    return (
      trees.abstract(self.abstract_state, self.layout.state),
      trees.abstract(self.abstract_memory, self.layout.memory),
    )


def build_setup(
  experiment: experiment_lib.Experiment, mesh: Optional[jax.sharding.Mesh] = None
) -> Setup:
  """Shapes and layout of training on `mesh` (default: the config's mesh over
  this run's devices; aot.py passes a target's), from the checked
  experiment's abstract model. Nothing is allocated."""
  train, cfg = experiment.train, experiment.model
  mesh = sharding.make_mesh(experiment.mesh) if mesh is None else mesh
  graphdef, state_template, abstract_params = train_step.abstract_model(experiment)
  tx = train_step.make_optimizer(train, abstract_params)
  abstract_state = train_step.abstract_train_state(train, abstract_params, tx)
  abstract_memory = jax.eval_shape(
    lambda: memory_lib.init_memory(cfg, train.batch_size, jnp.dtype(cfg.dtype))
  )
  return Setup(
    graphdef=graphdef,
    state_template=state_template,
    tx=tx,
    abstract_state=abstract_state,
    abstract_memory=abstract_memory,
    layout=train_step.make_layout(
      experiment.mesh, mesh, state_template, abstract_state, abstract_memory
    ),
    num_params=sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params)),
  )


def train_data(
  experiment: experiment_lib.Experiment, layout: train_step.Layout, tokenizer: data_lib.Tokenizer
) -> tuple[data_lib.SegmentIterator, data_lib.Documents]:
  """(train iterator over this process's batch rows, evaluation documents)."""
  train, data, split = experiment.train, experiment.data, experiment.eval.split
  s, b, t = train.segments_per_step, train.batch_size, train.segment_length
  # This process reads only the batch rows its devices hold.
  row_start, num_rows = sharding.local_rows(layout.batch["inputs"], (s, b, t), axis=1)
  train_docs = data_lib.get_documents(data, "train", tokenizer)
  train_iter = data_lib.SegmentIterator(
    train_docs,
    batch_size=b,
    segment_length=t,
    seed=train.seed,
    repeat=True,
    row_start=row_start,
    num_rows=num_rows,
    vocab_size=experiment.model.vocab_size,
    source=data.source,
  )
  eval_docs = data_lib.get_documents(data, split, tokenizer)
  # Every document readable, decodable and long enough, before anything
  # compiles (a text_files corpus is otherwise read lazily, row by row).
  for name in dict.fromkeys(("train", split)):
    data_lib.check_documents(data, name, tokenizer)
  return train_iter, eval_docs


def step_batches(
  train: experiment_lib.TrainConfig, layout: train_step.Layout, train_iter: data_lib.SegmentIterator
) -> prefetch.StepIterator:
  """Each step's global batch [S, B, ...], of which this process makes its
  rows and transfers them to the batch sharding (in the prefetch thread)."""
  s, b = train.segments_per_step, train.batch_size

  def to_device(local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    return {
      k: sharding.global_array(layout.batch[k], v, (s, b) + v.shape[2:]) for k, v in local.items()
    }

  return prefetch.StepIterator(train_iter, s, put=to_device)


_ROW_KEYS = ("epoch", "position", "offset")


def global_data_state(
  state: dict[str, np.ndarray], it: data_lib.SegmentIterator
) -> dict[str, np.ndarray]:
  """The iterator position `state` of this process's rows (from `it`) as that
  of ALL batch rows, one process-independent dict.

  Each process knows only its own rows (compressive/data/iterator.py); they
  are exchanged so that the checkpoint holds every row and restores onto any
  number of processes (each takes its rows back, `local_data_state`).
  """
  state = dict(state)
  if jax.process_count() == 1:
    return state
  rows = np.stack([state[k] for k in _ROW_KEYS]).astype(np.int32)  # [3, rows]
  starts = np.asarray(multihost_utils.process_allgather(np.int32(it.row_start)))  # [P]
  every = np.asarray(multihost_utils.process_allgather(rows))  # [P, 3, rows]
  full = np.full([3, it.batch_size], -1, np.int64)
  for p in range(every.shape[0]):
    full[:, starts[p] : starts[p] + it.num_rows] = every[p]
  if (full < 0).any():
    raise RuntimeError("the processes' batch rows do not cover the global batch")
  state.update({k: full[i] for i, k in enumerate(_ROW_KEYS)})
  state["row_start"] = np.asarray(0, np.int64)
  state["num_rows"] = np.asarray(it.batch_size, np.int64)
  return state


def local_data_state(
  state: dict[str, np.ndarray], row_start: int, num_rows: int
) -> dict[str, np.ndarray]:
  """This process's rows of a checkpoint's (all-row) iterator state."""
  saved_rows = len(np.asarray(state["epoch"]).reshape(-1))
  if int(state.get("row_start", 0)) != 0 or int(state.get("num_rows", saved_rows)) != saved_rows:
    raise ValueError("the checkpoint's iterator state does not hold every batch row")
  local = dict(state)
  for k in _ROW_KEYS:
    local[k] = np.asarray(state[k], np.int64).reshape(-1)[row_start : row_start + num_rows]
  local["row_start"] = np.asarray(row_start, np.int64)
  local["num_rows"] = np.asarray(num_rows, np.int64)
  return local
