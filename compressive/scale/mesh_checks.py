"""Checks before anything compiles: the mesh of a `MeshConfig`
(compressive/scale/sharding.py) against the devices, and the batch, heads,
hidden units and widths against the mesh axes that split them, each a
MeshError naming the field (config.check runs it once, on the abstract
state, before the model is built for real).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from flax import nnx
import jax
from jax.sharding import PartitionSpec as P

from compressive.errors import MeshError
from compressive.scale.sharding import (
  MeshConfig,
  axis_names,
  axis_sizes,
  data_parallel_size,
  mesh_shape,
  param_specs,
  path_str,
)


def validate(
  mc: MeshConfig,
  state: nnx.State,
  *,
  batch_size: int,
  model: Any,
  num_devices: Optional[int] = None,
) -> tuple[int, ...]:
  """ConfigError, naming the field, if the mesh does not fit the devices or a
  batch, head, hidden or width size does not divide along its axes.

  Args:
    mc: the MeshConfig.
    state: the model's nnx state (an abstract one suffices: shapes and the
      parameters' logical axes).
    batch_size: training's rows per step.
    model: the model's config (its num_heads, d_model, d_ff and vocab_size
      name a size that does not divide).
    num_devices: defaults to jax.device_count() (all processes).

  Returns:
    The resolved mesh shape.
  """
  shape = mesh_shape(mc, num_devices)
  sizes = axis_sizes(mc, shape)
  where = f"mesh.shape={tuple(mc.shape)} -> {dict(sizes)}"
  dp = data_parallel_size(mc, shape)
  if batch_size % dp:
    raise MeshError(
      f"batch_size={batch_size} is not divisible by {dp}, the devices along "
      f"mesh.data_axes={tuple(mc.data_axes)} ({where})"
    )
  abstract_params = nnx.to_pure_dict(state)
  specs = jax.tree.leaves(param_specs(mc, state), is_leaf=lambda v: isinstance(v, P))
  m = model
  fields = {
    "model.num_heads": m.num_heads,
    "model.d_model": m.d_model,
    "model.d_ff": m.d_ff,
    "model.vocab_size": m.vocab_size,
  }
  for (path, x), spec in zip(jax.tree_util.tree_leaves_with_path(abstract_params), specs):
    name = path_str(path)
    for dim, (size, entry) in enumerate(zip(x.shape, tuple(spec) + (None,) * len(x.shape))):
      axes = axis_names(entry)
      n = math.prod(sizes[a] for a in axes)
      if size % n:
        named = [f"{k}={v}" for k, v in fields.items() if v == size]
        raise MeshError(
          f"{' or '.join(named) or f'size {size}'} does not divide along mesh axes {axes} "
          f"of size {n}: parameter {name} {tuple(x.shape)} dimension {dim} is sharded "
          f"that way by mesh.logical_axis_rules ({where}); change mesh.shape or the model size"
        )
  return shape
