"""Device mesh and partition rules from the config's mesh section (`MeshConfig`).

Notation: B batch rows, S segments per step, T segment length, L layers,
d width, H heads, D head width, V vocabulary.

    config.mesh.axes       mesh axis names: ('data', 'fsdp', 'tensor')
    config.mesh.shape      devices along each axis; one -1 means "the rest"
    config.mesh.data_axes  axes that split batch rows, and with them the memory
                           (per-row state, sharded exactly like the batch)
    config.mesh.logical_axis_rules
                           (logical axis, mesh axes) pairs: every parameter
                           declares a logical axis per dimension where it is
                           made (compressive/model/layers.py `param`: 'embed',
                           'heads', 'mlp', ...); this maps each to None, a mesh
                           axis, or a tuple of mesh axes. A logical axis with
                           no rule is a ConfigError. Optimizer state follows
                           its parameter.

The default rules put attention heads and MLP hidden units on 'tensor'
(Megatron-style: column-parallel in, row-parallel out), the vocabulary on
'tensor', and one d-sized dimension of every large matrix ('embed') on
'fsdp', whose shards are gathered as the step needs them; batch rows are split
over ('data', 'fsdp'). Every mesh runs the same program: only the layout
changes, so losses agree across meshes up to float reduction order.

Everything here takes the mesh's `MeshConfig` (an Experiment's `mesh`,
built once by `config.check`; `MeshConfig.from_config` reads one from a
config's mesh section) or a built Mesh as an argument; the entry points
decide about multi-host initialisation and call `processes.initialize_distributed`
before anything else touches JAX. `mesh_checks.validate` checks a mesh against
the devices, and the sizes it splits against its axes, before anything compiles.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

from flax import nnx
import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

from compressive import values
from compressive.errors import ConfigError, MeshError

# The logical axes the model's parameters use, and where the default config
# puts them. 'layers' is the leading axis of stacked (scanned) layers.
DEFAULT_LOGICAL_AXIS_RULES = (
  ("embed", "fsdp"),  # d, once per large matrix
  ("embed_out", None),  # the second d of a [d, d] matrix
  ("heads", "tensor"),
  ("head_dim", None),
  ("mlp", "tensor"),  # d_ff
  ("vocab", "tensor"),  # logits split along the vocabulary
  ("norm", None),  # d-sized scales and biases
  ("window", None),  # compression kernels' taps
  ("conv_layers", None),
  ("layers", None),
)


# What is wrong with a field of the mesh section by itself (values.sequence's
# rule): the words of the error after the field's name, "" for nothing.


def _axes_problem(axes: tuple) -> str:
  if axes and all(isinstance(a, str) and a for a in axes) and len(set(axes)) == len(axes):
    return ""
  return f"={axes!r} must be distinct non-empty names"


def _shape_problem(shape: tuple) -> str:
  if any(isinstance(n, bool) or not isinstance(n, int) or (n < 1 and n != -1) for n in shape):
    return f"={shape!r}: entries must be positive integers or -1"
  return f"={shape!r} has more than one -1" if shape.count(-1) > 1 else ""


def _rules_problem(rules: tuple) -> str:
  for rule in rules:
    if not isinstance(rule, (tuple, list)) or len(rule) != 2 or not isinstance(rule[0], str):
      return f": {rule!r} is not a (logical axis, mesh axes) pair"
  return ""


@dataclasses.dataclass(frozen=True, eq=False)
class MeshConfig:
  """The config's mesh section (`config.mesh`), typed and frozen: built once
  by `config.check` (`Experiment.mesh`), each field checked against its kind
  and its rule, then the fields against each other, as it is made (a field
  left out takes its default: the default config's mesh, data parallel over
  every device).

  Attributes:
    axes: the mesh axis names.
    shape: devices along each axis as configured; one -1 means "the rest"
      (`mesh_shape` resolves it against a device count).
    data_axes: the axes that split batch rows, and with them the memory.
    logical_axis_rules: (logical axis, mesh axes) pairs.
  """

  axes: tuple = values.sequence(("data", "fsdp", "tensor"), rule=_axes_problem)
  # -1: the devices the other axes leave. (Its entries are checked with the
  # fields against each other: a MeshError, which a tool reading a saved
  # config adds --mesh_shape to.)
  shape: tuple = values.sequence((-1, 1, 1))
  # Batch and memory rows are split along these.
  data_axes: tuple = values.sequence(("data", "fsdp"))
  # Each parameter's logical axis -> mesh axes (None: replicated).
  logical_axis_rules: tuple = values.sequence(DEFAULT_LOGICAL_AXIS_RULES, rule=_rules_problem)

  def __post_init__(self) -> None:
    """Each field against its kind and rule, then the fields against each
    other (against the devices: `mesh_shape`)."""
    values.check_fields(self, "mesh.")
    axes, shape = self.axes, self.shape
    if problem := _shape_problem(shape):
      raise MeshError(f"mesh.shape{problem}")
    if len(shape) != len(axes):
      raise MeshError(
        f"mesh.shape={shape!r} has {len(shape)} entries but mesh.axes={axes!r} has {len(axes)}"
      )
    for a in self.data_axes:
      if a not in axes:
        raise ConfigError(
          f"mesh.data_axes={tuple(self.data_axes)!r} names {a!r}, not in mesh.axes={axes!r}"
        )
    for rule in self.logical_axis_rules:
      for a in axis_names(rule[1]):
        if a not in axes:
          raise ConfigError(
            f"mesh.logical_axis_rules: {rule[0]!r} -> {a!r}, not in mesh.axes={axes!r}"
          )

  @classmethod
  def from_config(cls, section: Any) -> "MeshConfig":
    """From the config's mesh section (a mapping, or what has to_dict; a field it
    lacks takes the default), each as a tuple; ConfigError for a field it
    does not know."""
    section = section.to_dict() if hasattr(section, "to_dict") else section
    if isinstance(section, Mapping):
      section = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in section.items()}
    return values.from_dict(cls, section, "mesh.")


# -- The mesh. ----------------------------------------------------------------


def mesh_shape(mc: MeshConfig, num_devices: Optional[int] = None) -> tuple[int, ...]:
  """`mc.shape` (a MeshConfig's) with its -1 resolved; ConfigError if it
  does not fit."""
  n = jax.device_count() if num_devices is None else num_devices
  shape = tuple(mc.shape)
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if n % known:
      raise MeshError(
        f"mesh.shape={shape}: the other axes take {known} devices, which does not "
        f"divide the {n} devices available"
      )
    shape = tuple(n // known if s == -1 else s for s in shape)
  if math.prod(shape) != n:
    raise MeshError(
      f"mesh.shape={tuple(mc.shape)} needs {math.prod(shape)} devices but {n} are "
      f"available; make the product {n} or use -1 on one axis"
    )
  return shape


def make_mesh(mesh: MeshConfig, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """The device mesh of a MeshConfig over all devices (of
  every process).

  Axes are Auto: the program is written for one device and XLA partitions
  it from the input and output shardings (GSPMD), so the model code carries
  no sharding annotations.
  """
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(mesh, len(devices))
  axes = mesh.axes
  return jax.make_mesh(
    shape, axes, axis_types=(jax.sharding.AxisType.Auto,) * len(axes), devices=devices
  )


def axis_names(entry: str | Sequence[str] | None) -> tuple[str, ...]:
  """The mesh axes one entry of a partition spec or rule names: none, one
  or several."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def axis_sizes(mc: MeshConfig, shape: Sequence[int]) -> dict[str, int]:
  """The size of each of `mc`'s mesh axes, by name, in a resolved mesh
  shape (in the order of mesh.axes)."""
  return dict(zip(mc.axes, shape))


def data_parallel_size(mc: MeshConfig, mesh: Mesh | Sequence[int]) -> int:
  """How many ways batch rows are split: the product of the data axes' sizes
  (of the MeshConfig `mc`) in `mesh` (a Mesh, or a resolved
  mesh shape in the order of mesh.axes)."""
  sizes = dict(mesh.shape) if isinstance(mesh, Mesh) else axis_sizes(mc, mesh)
  return math.prod(sizes[a] for a in mc.data_axes)


# -- Partition specs. -----------------------------------------------------------


def path_str(path: jax.tree_util.KeyPath) -> str:
  """'blocks/0/attention/wq' for a pytree key path."""
  return jax.tree_util.keystr(tuple(path), simple=True, separator="/")


def logical_axes(state: nnx.State) -> dict[str, tuple[str, ...]]:
  """{parameter path: its logical axes}, read from the metadata of the
  model's variables in `state` (an abstract state suffices: shapes, no
  arrays), where the model declares them as it makes each parameter
  (compressive/model/layers.py `param`). ConfigError names a parameter made
  without axes."""
  table = {}
  for path, var in nnx.to_flat_state(state):
    axes, shape = var.get_metadata().get("out_sharding"), tuple(var.get_value().shape)
    name = "/".join(str(k) for k in path)
    if axes is None or len(axes) != len(shape):
      raise ConfigError(
        f"parameter {name} {shape} declares no logical axes "
        f"({axes!r}); make it with compressive.model.layers.param"
      )
    table[name] = tuple(axes)
  return table


def spec_for_axes(mc: MeshConfig, axes: Sequence[str], name: str) -> P:
  """The PartitionSpec of logical `axes` under mesh.logical_axis_rules (of
  the MeshConfig `mc`)."""
  rules = dict(mc.logical_axis_rules)
  entries = []
  for a in axes:
    if a not in rules:
      raise ConfigError(
        f"mesh.logical_axis_rules has no rule for logical axis {a!r} "
        f"(parameter {name}); add ({a!r}, None) to replicate it"
      )
    names = axis_names(rules[a])
    entries.append(None if not names else names[0] if len(names) == 1 else names)
  used = [n for e in entries for n in axis_names(e)]
  if len(set(used)) != len(used):
    raise ConfigError(
      f"mesh.logical_axis_rules put parameter {name} {tuple(axes)} on mesh "
      f"axes {used}: a mesh axis may split only one of its dimensions"
    )
  return P(*entries) if used else P()  # replicated: one spelling, P()


def param_specs(mc: MeshConfig, state: nnx.State) -> Any:
  """A PartitionSpec for every parameter of the model's (abstract) `state`,
  as a pure dict shaped like `nnx.to_pure_dict(state)` (the params)."""
  table = logical_axes(state)
  return jax.tree_util.tree_map_with_path(
    lambda path, _: spec_for_axes(mc, table[path_str(path)], path_str(path)),
    nnx.to_pure_dict(state),
  )


def state_specs(mc: MeshConfig, state: nnx.State, tree: Any) -> Any:
  """PartitionSpecs for a tree holding the parameters of `state` and state
  shaped like them (a TrainState: its params, and Adam's mu and nu inside
  the optimizer state).

  Matched by structure: every subtree with the params' structure (leaves
  that a masked optimizer leaves out may be `optax.MaskedNode`s) gets the
  parameter specs leaf for leaf, where a leaf has its parameter's shape;
  everything else (step, counts, RNG keys, factored statistics) is
  replicated.
  """
  specs, params = param_specs(mc, state), nnx.to_pure_dict(state)
  treedef = jax.tree.structure(params)
  masked = lambda x: isinstance(x, optax.MaskedNode)
  # jaxlib ships no types for PyTreeDef, whose == mypy then refuses.
  like_params = lambda x: jax.tree.structure(x, is_leaf=masked) == treedef  # type: ignore[operator]

  def follow(subtree: Any) -> Any:
    if not like_params(subtree):
      return P()  # a leaf outside every params-shaped subtree
    return jax.tree.map(
      lambda spec, p, x: x if masked(x) else spec if tuple(x.shape) == tuple(p.shape) else P(),
      specs,
      params,
      subtree,
      is_leaf=lambda v: isinstance(v, P) or masked(v),
    )

  return jax.tree.map(follow, tree, is_leaf=like_params)


def gathered_specs(mc: MeshConfig, specs: Any) -> Any:
  """The specs with the data axes dropped: how parameters are laid out while
  the step computes with them.

  A parameter axis that also splits batch rows ('fsdp') only stores the
  parameter: to compute, each device needs the weights whole along it (XLA
  all-gathers them, and reduce-scatters their gradients), while 'tensor'
  splits stay in place as the model's heads and hidden units.
  """
  data = set(mc.data_axes)

  def drop(entry: str | Sequence[str] | None) -> str | tuple[str, ...] | None:
    kept = tuple(a for a in axis_names(entry) if a not in data)
    return None if not kept else kept[0] if len(kept) == 1 else kept

  return jax.tree.map(
    lambda spec: P(*[drop(e) for e in spec]), specs, is_leaf=lambda x: isinstance(x, P)
  )


def gather_for_compute(
  params: Any, compute: Any, stored: Any, dtype: jax.typing.DTypeLike | None = None
) -> Any:
  """`params` laid out as `compute` (gathered along the data axes) for the
  forward pass, with their gradient laid out as `stored`; matrices (2 or
  more dimensions) are first cast to `dtype`, the activations' (bfloat16
  runs gather half the bytes; the model casts each weight to it anyway).

  A plain sharding constraint is its own transpose: the gradient would be
  summed over the data axes into whole, replicated arrays (an all-reduce of
  every gradient, full-size in every device's memory) and only then cut
  into the stored shards. Constraining the gradient to the stored layout,
  in the dtype the model computed it in, lets XLA sum each shard onto the
  device that stores it (a reduce-scatter), as FSDP means to.
  """
  cast = lambda p: p.astype(dtype) if dtype is not None and p.ndim >= 2 else p

  @jax.custom_vjp
  def gather(p: Any) -> Any:
    return jax.lax.with_sharding_constraint(jax.tree.map(cast, p), compute)

  def forward(p: Any) -> tuple[Any, Any]:
    return gather(p), jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), p)

  def backward(primals: Any, cotangent: Any) -> tuple[Any]:
    cotangent = jax.lax.with_sharding_constraint(cotangent, stored)
    return (jax.tree.map(lambda c, p: c.astype(p.dtype), cotangent, primals),)

  gather.defvjp(forward, backward)
  return gather(params)


def shardings(mesh: Mesh, specs: Any) -> Any:
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def rows_sharding(mesh: Mesh, mc: MeshConfig, ndim: int, axis: int) -> NamedSharding:
  """Rows (dimension `axis` of an ndim array) split along the data axes."""
  spec: list[Any] = [None] * ndim
  spec[axis] = tuple(mc.data_axes)
  return NamedSharding(mesh, P(*spec))


def memory_shardings(mesh: Mesh, mc: MeshConfig, memory: Any) -> Any:
  """Every memory field is [L, B, ...]: rows split exactly like the batch."""
  return jax.tree.map(lambda x: rows_sharding(mesh, mc, len(x.shape), 1), memory)


# -- Process-local rows. --------------------------------------------------------


def local_rows(sharding: NamedSharding, global_shape: Sequence[int], axis: int) -> tuple[int, int]:
  """(first row, number of rows) of dimension `axis` held by this process.

  The rows of a process must be contiguous (true of `jax.make_mesh` meshes,
  which order devices process by process); the data pipeline then reads
  exactly global rows [first, first + number).
  """
  rows: set[int] = set()
  for index in sharding.addressable_devices_indices_map(tuple(global_shape)).values():
    assert index is not None  # devices_indices_map's, never None (jax types it loosely)
    rows.update(range(*index[axis].indices(global_shape[axis])))
  start, stop = min(rows), max(rows) + 1
  if len(rows) != stop - start:
    raise ConfigError(
      f"this process holds non-contiguous batch rows {sorted(rows)}; reorder mesh.axes "
      "so that the data axes come first"
    )
  return start, stop - start


def global_array(
  sharding: NamedSharding, local: np.ndarray, global_shape: Sequence[int]
) -> jax.Array:
  """One global array from every process's rows (each passes its own)."""
  return jax.make_array_from_process_local_data(sharding, local, tuple(global_shape))
