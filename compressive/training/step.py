"""The train state and the train step: one jitted call of S segments.

Notation: S segments per step, B rows, T segment length.

One jitted call runs S consecutive segments of every row with `lax.scan`,
carrying (train state, memory) and making one optimizer update per segment,
as the paper trains (truncated BPTT over one segment); with
`config.grad_accum_steps` > 1 each segment's gradient is first summed over
micro-batches of rows (the same update, less activation memory;
accumulation.py). The memory is part of the carry, never module state, so
the loop (train_lib) can save it with every checkpoint.

Sharding (compressive/scale/sharding.py): the train state, the memory and every
batch live on the config's device mesh (`Layout`); the step is one `jit`
with input and output shardings, so the same code runs on one CPU, a GPU
node or a TPU slice.

`_forward` is the step's one call of the model and its one reader of the
model's aux outputs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, Optional, Self

from flax import nnx
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
import optax

from compressive import experiment as experiment_lib
from compressive.model import losses
from compressive.model import memory as memory_lib
from compressive.model.config import ModelConfig
from compressive.model.transformer import CompressiveTransformer, merge_params
from compressive.scale import sharding
from compressive.training import accumulation

Batch = dict[str, jax.Array]  # inputs, targets, mask [..., B, T]; start_of_sequence [..., B]
Scalars = dict[str, jax.Array]  # by name: the model's scalars, a step's metrics
Output = tuple[jax.Array, jax.Array, memory_lib.Memory, Scalars]  # (nats, count, memory, scalars)
Forward = Callable[[Any, Batch, memory_lib.Memory, jax.Array], Output]  # (params, seg, memory, rng)
Aux = tuple[memory_lib.Memory, Scalars, jax.Array, jax.Array]  # (memory, scalars, nats, count)
Gradients = tuple[Any, memory_lib.Memory, Scalars, jax.Array, jax.Array]  # (grads, memory, ...)
Carry = tuple["TrainState", memory_lib.Memory]


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: optimizer updates made (one per segment)
  params: Any  # pure dict of parameters (nnx.to_pure_dict)
  opt_state: Any
  rng: jax.Array  # uint32 [2]: dropout key, folded with `step`

  if TYPE_CHECKING:  # flax.struct.dataclass adds it; its stub does not declare it

    def replace(self, **updates: Any) -> Self: ...


def build_model(
  model_config: ModelConfig, seed: int
) -> tuple[nnx.GraphDef, nnx.State, dict[str, Any]]:
  """(graphdef, nnx state, initial params dict) of the model of
  `model_config`, its parameters drawn from `seed`."""
  model = CompressiveTransformer(model_config, rngs=nnx.Rngs(seed))
  graphdef, state = nnx.split(model)
  return graphdef, state, nnx.to_pure_dict(state)


def abstract_model(
  experiment: experiment_lib.Experiment,
) -> tuple[nnx.GraphDef, nnx.State, dict[str, Any]]:
  """(graphdef, abstract nnx state, abstract params dict): shapes, no arrays;
  the checked Experiment's own, built when it was checked."""
  graphdef, state = experiment.graphdef, experiment.abstract_state
  return graphdef, state, nnx.to_pure_dict(state)


def learning_rate_schedule(train: experiment_lib.TrainConfig) -> optax.Schedule:
  """Linear warmup to the peak, then cosine decay (paper §5), in updates."""
  s = train.updates_per_step
  opt = train.optimizer
  total = max(train.num_train_steps * s, 1)
  warmup = min(opt.warmup_steps * s, total)
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=opt.learning_rate,
    warmup_steps=warmup,
    decay_steps=max(total, warmup + 1),
    end_value=opt.learning_rate * opt.final_lr_fraction,
  )


def make_optimizer(train: experiment_lib.TrainConfig, params: Any) -> optax.GradientTransformation:
  """Adam(W) with global-norm clipping; the compressor is clipped on its own.

  The compression network learns only from the reconstruction loss (§3.2);
  clipping it separately keeps that auxiliary gradient from throttling the
  language model's updates through a shared global norm.
  """
  opt = train.optimizer
  schedule = learning_rate_schedule(train)

  def base() -> optax.GradientTransformation:
    if opt.name == "adamw":
      adam = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
    else:
      adam = optax.adam(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps)
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adam)

  labels = jax.tree_util.tree_map_with_path(
    lambda path, _: (
      "compressor" if any(getattr(k, "key", None) == "compressor" for k in path) else "model"
    ),
    params,
  )
  return optax.multi_transform({"model": base(), "compressor": base()}, labels)


def create_train_state(
  train: experiment_lib.TrainConfig, params: Any, tx: optax.GradientTransformation
) -> TrainState:
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.PRNGKey(train.seed + 1),
  )


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where training's arrays live on the mesh (pytrees of NamedSharding)."""

  mesh: Mesh
  state: Any  # TrainState: parameters and optimizer state by mesh.logical_axis_rules
  compute_params: Any  # parameters while computing: gathered along the data axes
  memory: Any  # Memory: rows split along mesh.data_axes, like the batch
  batch: dict[str, NamedSharding]  # [S, B, ...]: rows along mesh.data_axes

  @property
  def replicated(self) -> NamedSharding:
    return sharding.replicated(self.mesh)


def make_layout(
  config: sharding.MeshConfig,
  mesh: Mesh,
  state_template: nnx.State,
  abstract_state: TrainState,
  abstract_memory: memory_lib.Memory,
) -> Layout:
  """Shardings of the train state, memory and batch (shapes suffice) on
  `mesh`, built from `config` (the MeshConfig), from the parameters' logical axes in the model's
  (abstract) `state_template`."""
  specs = sharding.state_specs(config, state_template, abstract_state)
  state = sharding.shardings(mesh, specs)
  compute = sharding.gathered_specs(config, specs.params)
  batch = {
    k: sharding.rows_sharding(mesh, config, n, 1)
    for k, n in (("inputs", 3), ("targets", 3), ("mask", 3), ("start_of_sequence", 2))
  }
  return Layout(
    mesh=mesh,
    state=state,
    compute_params=sharding.shardings(mesh, compute),
    memory=sharding.memory_shardings(mesh, config, abstract_memory),
    batch=batch,
  )


def abstract_train_state(
  train: experiment_lib.TrainConfig, abstract_params: Any, tx: optax.GradientTransformation
) -> TrainState:
  return jax.eval_shape(lambda p: create_train_state(train, p, tx), abstract_params)


def init_train_state(
  experiment: experiment_lib.Experiment, tx: optax.GradientTransformation, layout: Layout
) -> TrainState:
  """A fresh train state, each parameter initialised straight into its shards."""
  train = experiment.train
  return jax.jit(
    lambda: create_train_state(train, build_model(experiment.model, train.seed)[2], tx),
    out_shardings=layout.state,
  )()


def init_sharded_memory(
  model_config: ModelConfig, batch_size: int, layout: Layout
) -> memory_lib.Memory:
  """A fresh memory of `batch_size` rows for the model of `model_config`,
  laid out as `layout` says."""
  dtype = jnp.dtype(model_config.dtype)
  return jax.jit(
    lambda: memory_lib.init_memory(model_config, batch_size, dtype), out_shardings=layout.memory
  )()


def make_train_step(
  graphdef: nnx.GraphDef,
  state_template: nnx.State,
  tx: optax.GradientTransformation,
  dropout: bool,
  layout: Optional[Layout] = None,
  *,
  grad_accum_steps: int = 1,
  gradient_window: int = 1,
) -> jax.stages.Wrapped:
  """jit(train_step)(state, memory, batch) -> (state, memory, metrics).

  batch: inputs, targets [S, B, T] int32; mask [S, B, T] bool;
  start_of_sequence [S, B] bool. metrics: per segment, summed over rows.
  With a `layout`, inputs and outputs keep its shardings (metrics
  replicated) and XLA partitions the step over the mesh.

  `grad_accum_steps` = A > 1 computes each segment's gradient in A
  micro-batches of B / A rows, one after the other (activation memory of
  B / A rows), each with its own rows' memory, and sums them into ONE
  optimizer update per segment, weighted so that the update is the
  full-batch one (see `accumulation.accumulated_gradients`).

  `gradient_window` = W > 1 (beyond the paper; docs/DESIGN.md §Task-taught
  compression) makes one optimizer update per window of W consecutive
  segments instead of one per segment: the loss is the window's
  (`window_loss`), the memory is threaded through its segments inside the
  gradient, so with model.memory_gradient the loss of a segment reaches
  what earlier segments of its window stored (the compression network that
  compressed it, and with "memories" the layers that wrote it); nothing
  reaches back past the window's first segment. S must be a multiple of W;
  metrics stay per segment (grad_norm is the window's, repeated).
  """
  if grad_accum_steps < 1:
    raise ValueError(f"grad_accum_steps={grad_accum_steps} must be >= 1")
  if gradient_window < 1 or (gradient_window > 1 and grad_accum_steps > 1):
    raise ValueError(
      f"gradient_window={gradient_window} must be >= 1, and 1 with grad_accum_steps > 1"
    )
  model_config = nnx.merge(graphdef, state_template).config  # static: read once, not per trace
  forward = _model_forward(graphdef, state_template, model_config, layout, dropout)
  accumulated_gradients = accumulation.accumulated(
    grad_accum_steps, layout, model_config.reconstruction_loss
  )

  def segment(carry: Carry, seg: Batch) -> tuple[Carry, Scalars]:
    state, memory = carry
    gradients = _full_batch_gradients if grad_accum_steps == 1 else accumulated_gradients
    return _update(tx, layout, state, memory, seg, functools.partial(gradients, forward))

  def window(carry: Carry, segs: Batch) -> tuple[Carry, Scalars]:
    state, memory = carry
    return _update(tx, layout, state, memory, segs, functools.partial(_window_gradients, forward))

  def train_step(
    state: TrainState, memory: memory_lib.Memory, batch: Batch
  ) -> tuple[TrainState, memory_lib.Memory, Scalars]:
    if gradient_window == 1:  # the paper's: one update per segment
      (state, memory), metrics = jax.lax.scan(segment, (state, memory), batch)
      return state, memory, metrics
    # [S, B, ...] -> [S / W, W, B, ...]: one update per window of W segments
    windows = jax.tree.map(
      lambda x: x.reshape((x.shape[0] // gradient_window, gradient_window) + x.shape[1:]), batch
    )
    (state, memory), metrics = jax.lax.scan(window, (state, memory), windows)
    return state, memory, jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), metrics)

  return jax.jit(train_step, donate_argnums=(0, 1), **_jit_shardings(layout))


def _model_forward(
  graphdef: nnx.GraphDef,
  state_template: nnx.State,
  model_config: ModelConfig,
  layout: Optional[Layout],
  dropout: bool,
) -> Forward:
  """The train step's forward(params, seg, memory, rng) -> Output: the model
  of `graphdef` with `params` (gathered from their shards to compute, with
  a `layout`) on one segment, drawing dropout from `rng` if `dropout`."""

  def forward(params: Any, seg: Batch, memory: memory_lib.Memory, rng: jax.Array) -> Output:
    if layout is not None:  # FSDP: gather the stored shards to compute
      params = sharding.gather_for_compute(
        params, layout.compute_params, layout.state.params, jnp.dtype(model_config.dtype)
      )
    model = merge_params(graphdef, state_template, params)
    return _forward(model, seg, memory, rng if dropout else None)

  return forward


def _jit_shardings(layout: Optional[Layout]) -> dict[str, Any]:
  """`jax.jit`'s in and out shardings of the train step on `layout`
  (metrics replicated); none without a layout."""
  shardings: dict[str, Any] = (
    {}
    if layout is None
    else dict(
      in_shardings=(layout.state, layout.memory, layout.batch),
      out_shardings=(layout.state, layout.memory, layout.replicated),
    )
  )
  return shardings


def _full_batch_gradients(
  forward: Forward, params: Any, seg: Batch, memory: memory_lib.Memory, rng: jax.Array
) -> Gradients:
  """(grads, new memory, scalars, nats, count) of one segment, the paper's."""

  def loss_fn(params: Any) -> tuple[jax.Array, Aux]:
    nats, count, new_memory, scalars = forward(params, seg, memory, rng)
    lm = nats / jnp.maximum(count, 1.0)
    # No mixing coefficient (§3.2): the two losses reach disjoint parameters.
    return lm + scalars["reconstruction_loss"], (new_memory, scalars, nats, count)

  grads, (new_memory, scalars, nats, count) = jax.grad(loss_fn, has_aux=True)(params)
  return grads, new_memory, scalars, nats, count


def _window_gradients(
  forward: Forward, params: Any, segs: Batch, memory: memory_lib.Memory, rng: jax.Array
) -> Gradients:
  """(grads, new memory, scalars, nats, count) of a window's loss (`window_loss`)."""
  grads, (new_memory, scalars, nats, count) = jax.grad(window_loss, has_aux=True)(
    params, forward, segs, memory, rng
  )
  return grads, new_memory, scalars, nats, count


def _update(
  tx: optax.GradientTransformation,
  layout: Optional[Layout],
  state: TrainState,
  memory: memory_lib.Memory,
  seg: Batch,
  gradients: Callable[[Any, Batch, memory_lib.Memory, jax.Array], Gradients],
) -> tuple[Carry, Scalars]:
  """One optimizer update from `gradients(params, seg, memory, rng)` of
  `seg` (a segment, or a window's segments): ((state, memory), metrics)."""
  rng = jax.random.fold_in(state.rng, state.step)
  grads, new_memory, scalars, nats, count = gradients(state.params, seg, memory, rng)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  grad_norm = optax.tree.norm(grads)
  metrics = dict(
    scalars,
    nats=nats,
    tokens=count,
    grad_norm=jnp.broadcast_to(grad_norm, nats.shape),
    finite=jnp.isfinite(nats) & jnp.isfinite(grad_norm),
  )
  if layout is not None:  # keep the carry laid out as it came in
    new_state = jax.lax.with_sharding_constraint(new_state, layout.state)
    new_memory = jax.lax.with_sharding_constraint(new_memory, layout.memory)
  return (new_state, new_memory), metrics


def window_loss(
  params: Any, forward: Forward, segs: Batch, memory: memory_lib.Memory, rng: jax.Array
) -> tuple[jax.Array, Aux]:
  """The loss of a window of W segments, differentiable in `params` through
  the memory it threads (what model.memory_gradient leaves differentiable),
  and (the memory after it, stop-gradient; per-segment scalars, nats and
  counts, each [W]).

  The loss is the window's mean next-token loss (nats over every predicted
  token of its W segments) plus the mean of its segments' reconstruction
  losses: with W = 1 the paper's segment loss, LM + reconstruction.
  `forward(params, seg, memory, rng)` is the train step's call of the model;
  segment k of the window draws its dropout from fold_in(rng, k). The memory
  that enters is not differentiated: the window's first segment is where
  the gradient stops.
  """
  w = jax.tree.leaves(segs)[0].shape[0]

  def one(
    memory: memory_lib.Memory, xs: tuple[jax.Array, Batch]
  ) -> tuple[memory_lib.Memory, tuple[Scalars, jax.Array, jax.Array]]:
    k, seg = xs
    nats, count, new_memory, scalars = forward(params, seg, memory, jax.random.fold_in(rng, k))
    return new_memory, (scalars, nats, count)

  new_memory, (scalars, nats, count) = jax.lax.scan(
    one, jax.lax.stop_gradient(memory), (jnp.arange(w), segs)
  )
  loss = nats.sum() / jnp.maximum(count.sum(), 1.0) + scalars["reconstruction_loss"].mean()
  return loss, (jax.lax.stop_gradient(new_memory), scalars, nats, count)


def _forward(
  model: CompressiveTransformer,
  seg: Batch,
  memory: memory_lib.Memory,
  dropout_rng: Optional[jax.Array],
) -> Output:
  """(nats, count, new memory, scalars) of one segment: the train step's one
  call of the model, and the one place that reads the model's aux.

  nats and count are summed over the segment's predicted tokens; scalars are
  the model's per-segment float32 scalars, `reconstruction_loss` (the loss
  that trains the compressor) and `attention_mass/<bank>` (diagnostics).
  """
  logits, new_memory, aux = model(
    seg["inputs"], memory, seg["start_of_sequence"], dropout_rng=dropout_rng
  )
  nats, count = losses.cross_entropy(logits, seg["targets"], seg["mask"])
  return nats, count, new_memory, aux.scalars()
