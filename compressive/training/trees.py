"""The forms of the trees a checkpoint stores and restores into: the
abstract (shape, dtype, sharding) targets of a restore, the memory without
its zero-size fields (which Orbax refuses to save) and back, and the
parameter shapes that a restore compares before it reads anything."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from compressive.training.integrity import path_name


def param_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """Parameter name -> shape, for the `params` of a train state or of a saved
  state's metadata (their other entries are laid out differently)."""
  leaves = jax.tree_util.tree_leaves_with_path(
    tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict)
  )
  out = {}
  for path, leaf in leaves:
    name = path_name(path)
    if name.startswith("params/"):
      out[name[len("params/") :]] = tuple(int(n) for n in leaf.shape)
  return out


def nonempty_fields(memory: Any) -> Any:
  """The memory's array fields as a dict, without zero-size ones (a
  Transformer-XL has no compressed memory, a segment-local model no memory),
  which Orbax refuses to save. Training memories carry no key/value cache."""
  if not dataclasses.is_dataclass(memory):
    return memory
  fields = {f.name: getattr(memory, f.name) for f in dataclasses.fields(memory)}
  return {k: v for k, v in fields.items() if hasattr(v, "shape") and np.prod(v.shape) > 0}


def with_empty_fields(abstract_memory: Any, restored: Any) -> Any:
  """Inverse of `nonempty_fields`: the memory, zero-size fields recreated."""
  if not dataclasses.is_dataclass(abstract_memory):
    return restored
  fields = {}
  for f in dataclasses.fields(abstract_memory):
    x = getattr(abstract_memory, f.name)
    if f.name in restored or not hasattr(x, "shape"):
      fields[f.name] = restored.get(f.name, x)
    else:
      sharding = getattr(x, "sharding", None)
      fields[f.name] = jax.jit(lambda x=x: jnp.zeros(x.shape, x.dtype), out_shardings=sharding)()
  # is_dataclass narrows to an instance or a class; a memory is an instance.
  return dataclasses.replace(cast(Any, abstract_memory), **fields)


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
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )
