"""Training: train state, the scanned train step, and train_and_evaluate().

Notation: S segments per step, B rows, T segment length.

One jitted call runs S consecutive segments of every row with `lax.scan`,
carrying (train state, memory) and making one optimizer update per segment,
as the paper trains (truncated BPTT over one segment); with
`config.grad_accum_steps` > 1 each segment's gradient is first summed over
micro-batches of rows (the same update, less activation memory). The memory
is part of the carry, never module state, and is saved with every checkpoint
together with the data iterator's position, so a resumed run sees exactly
the batches and memories it would have.

Sharding (compressive/sharding.py): the train state, the memory and every
batch live on the config's device mesh; the step is one `jit` with input and
output shardings, so the same code runs on one CPU, a GPU node or a TPU
slice. Each process reads only its own batch rows and contributes them to a
global batch; checkpoints are written collectively and restore onto any
mesh whose batch split divides the batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from typing import Any, Callable, Iterator, Optional

import flax.struct
from flax import nnx
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
import ml_collections
import numpy as np
import optax

from compressive import checkpoint as ckpt_lib
from compressive import data as data_lib
from compressive import eval_lib
from compressive import flops as flops_lib
from compressive import losses
from compressive import memory as memory_lib
from compressive import sharding
from compressive import workdir_lock
from compressive.config_lib import ConfigError, ModelConfig
from compressive.errors import CheckpointError
from compressive.metrics import MetricWriter, read_jsonl
from compressive.model import BANKS, CompressiveTransformer, merge_params

_log = logging.getLogger("compressive")


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: optimizer updates made (one per segment)
  params: Any  # pure dict of parameters (nnx.to_pure_dict)
  opt_state: Any
  rng: jax.Array  # uint32 [2]: dropout key, folded with `step`


def build_model(config: ml_collections.ConfigDict, seed: Optional[int] = None):
  """(graphdef, abstract nnx state, initial params dict) of the config's model."""
  model = CompressiveTransformer(config.model, rngs=nnx.Rngs(config.seed if seed is None else seed))
  graphdef, state = nnx.split(model)
  return graphdef, state, nnx.to_pure_dict(state)


def abstract_model(config: ml_collections.ConfigDict):
  """(graphdef, abstract nnx state, abstract params dict): shapes, no arrays."""
  model = nnx.eval_shape(
      lambda: CompressiveTransformer(config.model, rngs=nnx.Rngs(config.seed)))
  graphdef, state = nnx.split(model)
  return graphdef, state, nnx.to_pure_dict(state)


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to the peak, then cosine decay (paper §5), in updates."""
  s = config.segments_per_step
  opt = config.optimizer
  total = max(config.num_train_steps * s, 1)
  warmup = min(opt.warmup_steps * s, total)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=opt.learning_rate, warmup_steps=warmup,
      decay_steps=max(total, warmup + 1), end_value=opt.learning_rate * opt.final_lr_fraction)


def make_optimizer(config: ml_collections.ConfigDict, params) -> optax.GradientTransformation:
  """Adam(W) with global-norm clipping; the compressor is clipped on its own.

  The compression network learns only from the reconstruction loss (§3.2);
  clipping it separately keeps that auxiliary gradient from throttling the
  language model's updates through a shared global norm.
  """
  opt = config.optimizer
  schedule = learning_rate_schedule(config)

  def base():
    if opt.name == "adamw":
      adam = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
    else:
      adam = optax.adam(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps)
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adam)

  labels = jax.tree_util.tree_map_with_path(
      lambda path, _: "compressor" if any(
          getattr(k, "key", None) == "compressor" for k in path) else "model", params)
  return optax.multi_transform({"model": base(), "compressor": base()}, labels)


def create_train_state(config, params, tx) -> TrainState:
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
      rng=jax.random.PRNGKey(config.seed + 1))


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where training's arrays live on the mesh (pytrees of NamedSharding)."""
  mesh: Mesh
  state: Any  # TrainState: parameters and optimizer state by mesh.rules
  compute_params: Any  # parameters while computing: gathered along the data axes
  memory: Any  # Memory: rows split along mesh.data_axes, like the batch
  batch: dict[str, NamedSharding]  # [S, B, ...]: rows along mesh.data_axes

  @property
  def replicated(self) -> NamedSharding:
    return sharding.replicated(self.mesh)


def make_layout(config: ml_collections.ConfigDict, mesh: Mesh, abstract_params,
                abstract_state: TrainState, abstract_memory) -> Layout:
  """Shardings of the train state, memory and batch (shapes suffice)."""
  state = sharding.shardings(mesh, sharding.state_specs(config, abstract_params, abstract_state))
  compute = sharding.gathered_specs(config, sharding.param_specs(config, abstract_params))
  batch = {k: sharding.rows_sharding(mesh, config, n, 1)
           for k, n in (("inputs", 3), ("targets", 3), ("mask", 3), ("start_of_sequence", 2))}
  return Layout(mesh=mesh, state=state, compute_params=sharding.shardings(mesh, compute),
                memory=sharding.memory_shardings(mesh, config, abstract_memory), batch=batch)


def abstract_train_state(config: ml_collections.ConfigDict, abstract_params, tx) -> TrainState:
  return jax.eval_shape(lambda p: create_train_state(config, p, tx), abstract_params)


def init_train_state(config: ml_collections.ConfigDict, tx, layout: Layout) -> TrainState:
  """A fresh train state, each parameter initialised straight into its shards."""
  return jax.jit(lambda: create_train_state(config, build_model(config)[2], tx),
                 out_shardings=layout.state)()


def init_sharded_memory(config: ml_collections.ConfigDict, batch_size: int, layout: Layout):
  dtype = jnp.dtype(config.model.dtype)
  return jax.jit(lambda: memory_lib.init_memory(config.model, batch_size, dtype),
                 out_shardings=layout.memory)()


def make_train_step(graphdef, state_template, tx, dropout: bool,
                    layout: Optional[Layout] = None, *, grad_accum_steps: int = 1) -> Callable:
  """jit(train_step)(state, memory, batch) -> (state, memory, metrics).

  batch: inputs, targets [S, B, T] int32; mask [S, B, T] bool;
  start_of_sequence [S, B] bool. metrics: per segment, summed over rows.
  With a `layout`, inputs and outputs keep its shardings (metrics
  replicated) and XLA partitions the step over the mesh.

  `grad_accum_steps` = A > 1 computes each segment's gradient in A
  micro-batches of B / A rows, one after the other (activation memory of
  B / A rows), each with its own rows' memory, and sums them into ONE
  optimizer update per segment, weighted so that the update is the
  full-batch one (see `_accumulated_gradients`).
  """
  if grad_accum_steps < 1:
    raise ValueError(f"grad_accum_steps={grad_accum_steps} must be >= 1")
  dp = _data_split(layout)

  def forward(params, seg, memory, rng):
    if layout is not None:  # FSDP: gather the stored shards to compute
      params = jax.lax.with_sharding_constraint(params, layout.compute_params)
    model = merge_params(graphdef, state_template, params)
    logits, new_memory, aux = model(
        seg["inputs"], memory, seg["start_of_sequence"],
        dropout_rng=rng if dropout else None)
    nats, count = losses.cross_entropy(logits, seg["targets"], seg["mask"])
    return nats, count, new_memory, aux

  def full_batch_gradients(params, seg, memory, rng):
    def loss_fn(params):
      nats, count, new_memory, aux = forward(params, seg, memory, rng)
      lm = nats / jnp.maximum(count, 1.0)
      # No mixing coefficient (§3.2): the two losses reach disjoint parameters.
      return lm + aux["reconstruction_loss"], (new_memory, aux, nats, count)

    grads, (new_memory, aux, nats, count) = jax.grad(loss_fn, has_aux=True)(params)
    return grads, new_memory, aux, nats, count

  def accumulated_gradients(params, seg, memory, rng):
    return _accumulated_gradients(
        forward, params, seg, memory, rng, grad_accum_steps, dp, layout,
        merge_params(graphdef, state_template, params).config.reconstruction_loss)

  def segment(carry, seg):
    state, memory = carry
    rng = jax.random.fold_in(state.rng, state.step)
    gradients = full_batch_gradients if grad_accum_steps == 1 else accumulated_gradients
    grads, new_memory, aux, nats, count = gradients(state.params, seg, memory, rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    grad_norm = optax.tree.norm(grads)
    metrics = dict(aux, nats=nats, tokens=count, grad_norm=grad_norm,
                   finite=jnp.isfinite(nats) & jnp.isfinite(grad_norm))
    if layout is not None:  # keep the carry laid out as it came in
      new_state = jax.lax.with_sharding_constraint(new_state, layout.state)
      new_memory = jax.lax.with_sharding_constraint(new_memory, layout.memory)
    return (new_state, new_memory), metrics

  def train_step(state, memory, batch):
    (state, memory), metrics = jax.lax.scan(segment, (state, memory), batch)
    return state, memory, metrics

  if layout is None:
    return jax.jit(train_step, donate_argnums=(0, 1))
  return jax.jit(train_step, donate_argnums=(0, 1),
                 in_shardings=(layout.state, layout.memory, layout.batch),
                 out_shardings=(layout.state, layout.memory, layout.replicated))


def _data_split(layout: Optional[Layout]) -> int:
  """How many ways the layout splits batch rows (1 without a layout)."""
  if layout is None:
    return 1
  entry = layout.batch["start_of_sequence"].spec[1]  # [S, B]: rows on the data axes
  names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
  return math.prod(layout.mesh.shape[a] for a in names)


def _split_rows(x: jax.Array, axis: int, parts: int, dp: int) -> jax.Array:
  """[..., B, ...] (rows at `axis`) -> [parts, ..., B / parts, ...].

  Micro-batch k takes the k-th 1/parts of every one of the `dp` data shards'
  rows, so each micro-batch is split over the devices as the batch is, and
  the split moves nothing between devices.
  """
  shape = x.shape
  m = shape[axis] // (dp * parts)
  y = x.reshape(shape[:axis] + (dp, parts, m) + shape[axis + 1:])
  y = jnp.moveaxis(y, axis + 1, 0)  # [parts, ..., dp, m, ...]
  return y.reshape((parts,) + shape[:axis] + (dp * m,) + shape[axis + 1:])


def _merge_rows(y: jax.Array, axis: int, dp: int) -> jax.Array:
  """The inverse of `_split_rows`: [parts, ..., B / parts, ...] -> [..., B, ...]."""
  parts, shape = y.shape[0], y.shape[1:]
  m = shape[axis] // dp
  z = y.reshape((parts,) + shape[:axis] + (dp, m) + shape[axis + 1:])
  z = jnp.moveaxis(z, 0, axis + 1)  # [..., dp, parts, m, ...]
  return z.reshape(shape[:axis] + (dp * parts * m,) + shape[axis + 1:])


def _reconstruction_row_weights(kind: str, memory, start_of_sequence, t: int) -> jax.Array:
  """[B] each row's share of the reconstruction loss's denominator.

  Each layer's reconstruction loss is a masked mean over the batch
  (losses._masked_mse): over the rows that evict a valid memory slot
  ("attention"), or over the valid evicted slots ("autoencoding"). The slots
  a segment evicts are the oldest T of [memory; segment] after the
  start-of-sequence reset (memory.push), and the masks are the same in every
  layer (every layer is reset and pushed alike), so layer 0 gives every
  layer's weights.
  """
  mask = memory.mem_mask[0]  # [B, M]
  mask = jnp.where(start_of_sequence[:, None], False, mask)
  evicted = jnp.concatenate([mask, jnp.ones((mask.shape[0], t), bool)], axis=1)[:, :t]  # [B, T]
  if kind == "attention":
    return evicted.any(-1).astype(jnp.float32)
  if kind == "autoencoding":
    return evicted.sum(-1).astype(jnp.float32)
  return jnp.ones(mask.shape[:1], jnp.float32)  # no reconstruction loss: 0 whatever the weight


def _accumulated_gradients(forward, params, seg, memory, rng, parts: int, dp: int,
                           layout: Optional[Layout], reconstruction: str):
  """(grads, new memory, aux, nats, count) of one segment, as the full batch
  gives them, computed in `parts` micro-batches by a `lax.scan`.

  The loss is LM + reconstruction (make_train_step). The LM loss is
  nats / count over the whole batch, so micro-batch k contributes
  nats_k / count with the FULL batch's count (known from the mask before
  anything runs). The reconstruction loss is, per layer, a masked mean
  S / W; micro-batch k's is S_k / W_k, so it contributes (W_k / W) of its
  loss (weights from `_reconstruction_row_weights`). The gradients then sum
  to the full batch's, up to float rounding; so do the metrics: nats and
  count summed, the reconstruction loss weighted alike, the attention masses
  (means over rows) averaged over the equal micro-batches. With dropout,
  micro-batch k draws its masks from fold_in(rng, k).
  """
  t = seg["inputs"].shape[-1]
  total = jnp.maximum(seg["mask"].astype(jnp.float32).sum(), 1.0)
  row_weights = _reconstruction_row_weights(reconstruction, memory, seg["start_of_sequence"], t)
  weights = _split_rows(row_weights, 0, parts, dp).sum(-1)  # [parts]
  coefficients = weights / jnp.maximum(weights.sum(), 1.0)
  micro_seg = {k: _split_rows(v, 0, parts, dp) for k, v in seg.items()}
  micro_memory = jax.tree.map(lambda x: _split_rows(x, 1, parts, dp), memory)
  if layout is not None:  # [parts, rows, ...]: the rows split as the batch's
    micro_seg = jax.lax.with_sharding_constraint(
        micro_seg, {k: layout.batch[k] for k in micro_seg})
    micro_memory = jax.lax.with_sharding_constraint(micro_memory, jax.tree.map(
        lambda s: NamedSharding(s.mesh, jax.sharding.PartitionSpec(None, *s.spec)),
        layout.memory))

  def micro(grads, xs):
    k, seg_k, memory_k, coefficient = xs

    def loss_fn(params):
      nats, count, new_memory, aux = forward(params, seg_k, memory_k, jax.random.fold_in(rng, k))
      return nats / total + coefficient * aux["reconstruction_loss"], (new_memory, aux, nats, count)

    g, out = jax.grad(loss_fn, has_aux=True)(params)
    grads = jax.tree.map(jnp.add, grads, g)
    if layout is not None:
      grads = jax.lax.with_sharding_constraint(grads, layout.state.params)
    return grads, out

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, (new_memory, aux, nats, count) = jax.lax.scan(
      micro, zeros, (jnp.arange(parts), micro_seg, micro_memory, coefficients))
  new_memory = jax.tree.map(lambda y: _merge_rows(y, 1, dp), new_memory)
  aux = {k: (jnp.sum(v * coefficients) if k == "reconstruction_loss" else jnp.mean(v))
         for k, v in aux.items()}
  return grads, new_memory, aux, nats.sum(), count.sum()


def stack_segments(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def validate_training_config(config: ml_collections.ConfigDict) -> None:
  """The training and optimizer fields, each against its meaningful range."""
  for name in ("batch_size", "num_train_steps", "segments_per_step", "log_every_steps",
               "keep_checkpoints"):
    value = config.get(name)
    if not _is_int(value) or value < 1:
      raise ConfigError(f"{name}={value!r} must be a positive integer")
  for name in ("eval_every_steps", "checkpoint_every_steps"):
    value = config.get(name)
    if not _is_int(value) or value < 0:
      raise ConfigError(f"{name}={value!r} must be an integer >= 0 (0: never)")
  if not _is_int(config.get("seed")):
    raise ConfigError(f"seed={config.get('seed')!r} must be an integer")
  opt = config.optimizer
  if opt.name not in ("adam", "adamw"):
    raise ConfigError(f"optimizer.name={opt.name!r} is unknown; choose adam or adamw")
  ranges = {  # field: (test, what it must be)
      "learning_rate": (lambda v: 0 < v < math.inf, "a finite number > 0"),
      "final_lr_fraction": (lambda v: 0 <= v <= 1, "in [0, 1] (a fraction of the peak)"),
      "b1": (lambda v: 0 <= v < 1, "in [0, 1)"),
      "b2": (lambda v: 0 <= v < 1, "in [0, 1)"),
      "eps": (lambda v: 0 < v < math.inf, "a finite number > 0"),
      "weight_decay": (lambda v: 0 <= v < math.inf, "a finite number >= 0"),
      "grad_clip_norm": (lambda v: v > 0, "> 0 (inf: no clipping)"),
  }
  for name, (ok, must) in ranges.items():
    value = opt.get(name)
    if not _is_number(value) or not ok(value):
      raise ConfigError(f"optimizer.{name}={value!r} must be {must}")
  if not _is_int(opt.get("warmup_steps")) or opt.warmup_steps < 0:
    raise ConfigError(f"optimizer.warmup_steps={opt.get('warmup_steps')!r} must be an integer >= 0")
  accum = grad_accum_steps(config)
  if not _is_int(accum) or accum < 1:
    raise ConfigError(f"grad_accum_steps={accum!r} must be a positive integer (1: no accumulation)")
  if config.batch_size % accum:
    raise ConfigError(f"batch_size={config.batch_size} is not divisible by "
                      f"grad_accum_steps={accum}: each micro-batch takes batch_size / "
                      "grad_accum_steps rows")


def grad_accum_steps(config: ml_collections.ConfigDict) -> int:
  """config.grad_accum_steps; 1 for a config saved before the field existed."""
  return config.get("grad_accum_steps", 1)


def validate_config(config: ml_collections.ConfigDict, *, training: bool = True) -> ModelConfig:
  """Checks the experiment config before anything is built; ConfigError.

  `training=False` (evaluating, analysing or sampling a trained config on
  this machine's mesh) skips what only training's step needs: the
  micro-batches of grad_accum_steps splitting along the mesh.
  """
  cfg = ModelConfig.from_config(config.model)
  validate_training_config(config)
  if config.data.tokenizer == "bytes" and cfg.vocab_size < 256:
    raise ConfigError(f"model.vocab_size={cfg.vocab_size} is below 256, the bytes tokenizer's vocabulary")
  eval_lib.validate_eval_config(config, cfg)
  # The mesh against the devices of every process, and the batch, heads,
  # hidden units and widths against the axes that split them: before any
  # compilation.
  shape = sharding.validate(config)
  accum = grad_accum_steps(config)
  dp = sharding.data_parallel_size(config, shape)
  if training and accum > 1 and (config.batch_size // accum) % dp:
    raise ConfigError(
        f"batch_size / grad_accum_steps = {config.batch_size} / {accum} = "
        f"{config.batch_size // accum} rows per micro-batch is not divisible by {dp}, the "
        f"devices along mesh.data_axes={tuple(sharding.mesh_config(config).data_axes)}; "
        "lower grad_accum_steps or raise batch_size")
  return cfg


class NonFiniteError(RuntimeError):
  """Training produced a NaN or infinite loss or gradient."""


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    stop_at_step: Optional[int] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    restore_intact: bool = False,
    profile_steps: Optional[tuple[int, int]] = None,
) -> dict[str, float]:
  """Trains (resuming from the workdir's latest checkpoint), evaluates.

  In a multi-process run every process calls this with the same arguments
  (after `jax.distributed.initialize`); process 0 alone writes the config,
  metrics and logs, and all processes write the checkpoints together.

  Args:
    config: the experiment config (configs/*.py).
    workdir: checkpoints, metrics and TensorBoard logs go here (shared by
      all processes).
    stop_at_step: return after this step (checkpointed) instead of running to
      `num_train_steps`; the schedule is unchanged (for tests and pauses).
    should_stop: polled after every step (e.g. set by a SIGTERM handler);
      when it returns True the step is checkpointed and training returns.
    restore_intact: if the newest checkpoint cannot be restored, resume from
      the newest one that can (instead of raising CheckpointError).
    profile_steps: (START, END): a JAX profiler trace of steps START..END
      (inclusive) into WORKDIR/profile (TensorBoard's profile tab, or
      Perfetto); steps this run does not make are not traced.

  Raises:
    NonFiniteError: a loss or gradient was not finite; nothing of that step
      is checkpointed, so the last good checkpoint stays the newest.

  Process 0 appends the "compressive" logger's lines to WORKDIR/train.log
  while this runs (a handler added here and removed on return).

  Returns:
    The last evaluation's metrics (or the last training metrics).
  """
  validate_config(config)
  profile_steps = validate_profile_steps(profile_steps)
  is_main = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  lock = _lock_workdir(workdir, is_main)
  log_file = None
  try:
    log_file = _add_log_file(workdir) if is_main else None
    checkpointer = ckpt_lib.Checkpointer(workdir, max_to_keep=config.keep_checkpoints)
    try:
      result = _train(config, workdir, checkpointer, is_main, stop_at_step, should_stop,
                      restore_intact, profile_steps)
    except BaseException:
      # Whatever ends the run (an exception, a second signal, a NaN): the
      # save in flight is finished before the error goes on, so no checkpoint
      # is left half-written and no Orbax thread outlives the process. A
      # failure of that save too is logged, and the first error reported.
      try:
        checkpointer.close()
      except Exception as e:  # pylint: disable=broad-except
        _log.warning("the checkpoint save in flight failed too: %s",
                     str(e).splitlines()[0] if str(e) else type(e).__name__)
      raise
    checkpointer.close()  # a failed last save is the run's error
    return result
  finally:
    if log_file is not None:
      _log.removeHandler(log_file)
      log_file.close()
    if lock is not None:
      lock.release()


LOG_FILE = "train.log"


class _LogFile(logging.FileHandler):
  """WORKDIR/train.log: appends the logger's lines. A write that fails (a
  full disk) stops the file with one warning instead of printing logging's
  traceback for every line; the console keeps the log."""

  def handleError(self, record):
    if getattr(self, "_failed", False):
      return
    self._failed = True
    import sys  # pylint: disable=g-import-not-at-top
    e = sys.exc_info()[1]
    why = getattr(e, "strerror", None) or str(e) or type(e).__name__
    print(f"warning: cannot write {self.baseFilename} ({why}); the log goes on on the console only",
          file=sys.stderr)

  def emit(self, record):
    if not getattr(self, "_failed", False):
      super().emit(record)


def _add_log_file(workdir: str) -> Optional[logging.Handler]:
  """Adds WORKDIR/train.log to the "compressive" logger; None if this process
  already logs to that file (a call within a call must not double lines)."""
  path = os.path.abspath(os.path.join(workdir, LOG_FILE))
  if any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in _log.handlers):
    return None
  handler = _LogFile(path, mode="a", encoding="utf-8")
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  _log.addHandler(handler)
  return handler


def validate_profile_steps(profile_steps) -> Optional[tuple[int, int]]:
  """(START, END) with 1 <= START <= END, or None; ConfigError otherwise."""
  if profile_steps is None:
    return None
  try:
    start, end = profile_steps
  except (TypeError, ValueError):
    start = end = None
  if not (_is_int(start) and _is_int(end) and 1 <= start <= end):
    raise ConfigError(f"profile_steps={profile_steps!r} must be (START, END) with "
                      "1 <= START <= END")
  return start, end


def hyperparameters(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config flattened for MetricWriter.write_hparams: dotted keys, values
  bool / int / float / str (tuples, lists, None and the rest as str)."""
  flat: dict[str, Any] = {}

  def visit(prefix: str, value):
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      for k, v in value.items():
        visit(f"{prefix}{k}.", v)
    elif isinstance(value, (bool, int, float, str)):
      flat[prefix[:-1]] = value
    else:
      flat[prefix[:-1]] = str(value)

  visit("", config.to_dict() if hasattr(config, "to_dict") else config)
  return flat


def _lock_workdir(workdir: str, is_main: bool):
  """Process 0 takes the workdir's lock; every process learns whether it could."""
  lock, busy = None, None
  if is_main:
    try:
      lock = workdir_lock.WorkdirLock(workdir).acquire()
    except workdir_lock.WorkdirBusyError as e:
      busy = e
  if _agree(busy is not None):
    raise busy or workdir_lock.WorkdirBusyError(
        f"{workdir} is in use by another trainer (process 0 could not lock it)")
  return lock


def _restore(checkpointer, abstract_state, abstract_memory, layout, restore_intact: bool,
             is_main: bool):
  """(step, (state, memory, data_state)) of the newest checkpoint that
  restores, or (0, None) when there is none.

  Without `restore_intact` any failure stops the run. With it, damaged
  checkpoints are moved aside into checkpoints/skipped/ (so that rotation
  never deletes them) and the next older one is tried; a shape mismatch is
  never skipped, and if every checkpoint is damaged the run stops rather
  than train from scratch over them.
  """
  steps = checkpointer.all_steps()
  if not steps:
    return 0, None
  skipped = []
  for step in reversed(steps):
    try:
      # Onto this run's mesh, whatever mesh wrote the checkpoint.
      return step, checkpointer.restore(
          step, ckpt_lib.abstract(abstract_state, layout.state),
          ckpt_lib.abstract(abstract_memory, layout.memory))
    except ckpt_lib.DamagedCheckpointError as e:
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
  raise CheckpointError(
      f"no checkpoint in {checkpointer.directory} restores: steps {skipped} are damaged and "
      f"were moved to {os.path.join(checkpointer.directory, ckpt_lib.SKIPPED_DIR)}; nothing "
      "was trained. Move them back to retry, or use another --workdir to start afresh")


def _newest_good_step(checkpointer, abstract_state, abstract_memory, layout) -> Optional[int]:
  """The newest saved step that restores, verifies and is finite."""
  checkpointer.wait()
  checkpointer.reload()
  for step in reversed(checkpointer.all_steps()):
    try:
      checkpointer.restore(step, ckpt_lib.abstract(abstract_state, layout.state),
                           ckpt_lib.abstract(abstract_memory, layout.memory))
      return step
    except CheckpointError as e:
      _log.warning("checkpoint %d is not usable: %s", step, e)
  return None


def _train(config, workdir, checkpointer, is_main, stop_at_step, should_stop,
           restore_intact, profile_steps=None) -> dict[str, float]:
  if checkpointer.all_steps():
    ckpt_lib.check_resume_config(workdir, config)

  tokenizer = data_lib.get_tokenizer(config.data)
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
        f"vocabulary ({tokenizer.vocab_size})")

  s, b, t = config.segments_per_step, config.batch_size, config.model.segment_length
  accum = grad_accum_steps(config)
  mesh = sharding.make_mesh(config)
  graphdef, state_template, abstract_params = abstract_model(config)
  tx = make_optimizer(config, abstract_params)
  abstract_state = abstract_train_state(config, abstract_params, tx)
  dtype = jnp.dtype(config.model.dtype)
  abstract_memory = jax.eval_shape(lambda: memory_lib.init_memory(config.model, b, dtype))
  layout = make_layout(config, mesh, abstract_params, abstract_state, abstract_memory)
  num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params))

  # This process reads only the batch rows its devices hold.
  row_start, num_rows = sharding.local_rows(layout.batch["inputs"], (s, b, t), axis=1)
  train_docs = data_lib.get_documents(config.data, "train", tokenizer)
  train_iter = data_lib.SegmentIterator(
      train_docs, batch_size=b, segment_length=t, seed=config.seed, repeat=True,
      row_start=row_start, num_rows=num_rows)
  eval_docs = data_lib.get_documents(config.data, config.eval.split, tokenizer)
  # Every document readable, decodable and long enough, before anything
  # compiles (a text_files corpus is otherwise read lazily, row by row).
  for split in dict.fromkeys(("train", config.eval.split)):
    data_lib.check_documents(config.data, split, tokenizer)

  start, restored = _restore(checkpointer, abstract_state, abstract_memory,
                             layout, restore_intact, is_main)
  if is_main:  # only once the run is known to fit what the workdir holds
    ckpt_lib.save_config(workdir, config)
  if config.optimizer.warmup_steps >= config.num_train_steps:
    _log.warning(
        "optimizer.warmup_steps=%d >= num_train_steps=%d: the learning rate is still warming "
        "up when the run ends and never reaches optimizer.learning_rate=%g",
        config.optimizer.warmup_steps, config.num_train_steps, config.optimizer.learning_rate)
  writer = MetricWriter(workdir, "train", enabled=is_main)
  eval_writer = MetricWriter(workdir, "eval", enabled=is_main)
  with contextlib.closing(writer), contextlib.closing(eval_writer), \
      _Profiler(profile_steps, os.path.join(workdir, "profile")) as profiler:
    if is_main and hasattr(writer, "write_hparams"):
      writer.write_hparams(hyperparameters(config))
    if restored is not None:
      state, memory, data_state = restored
      train_iter.set_state(_local_data_state(data_state, row_start, num_rows))
      if is_main:
        _truncate_metrics(writer.jsonl, start)
      _log.info("resumed from step %d in %s", start, workdir)
    else:
      state = init_train_state(config, tx, layout)
      memory = init_sharded_memory(config, b, layout)
      _log.info("training from scratch in %s: %d parameters", workdir, num_params)
    _log.info("mesh %s over %d devices in %d processes; this process reads rows [%d, %d)",
              dict(mesh.shape), mesh.size, jax.process_count(), row_start, row_start + num_rows)
    if accum > 1:
      _log.info("accumulating gradients over %d micro-batches of %d rows", accum, b // accum)

    train_step = make_train_step(graphdef, state_template, tx, config.model.dropout_rate > 0,
                                 layout, grad_accum_steps=accum)
    # MFU: model FLOPs over the devices' peak, where the peak is known (not on CPU).
    train_flops = flops_lib.flops_per_token(config.model, b // accum).train
    peak = flops_lib.device_peak_flops(config.model.dtype)
    peak = None if peak is None else peak * jax.device_count()
    end = config.num_train_steps if stop_at_step is None else min(stop_at_step, config.num_train_steps)
    bits_name = "bits_per_byte" if config.data.tokenizer == "bytes" else "bits_per_token"
    window: list[dict[str, Any]] = []
    last_eval: dict[str, float] = {}
    t_start = time.time()
    t_last, steps_timed = t_start, 0
    timing = dict(eval=0.0, evals=0, save=0.0, saves=0)
    step = start
    for step in range(start + 1, end + 1):
      profiler.before(step)  # the step's input pipeline included
      local = stack_segments([next(train_iter) for _ in range(s)])  # [S, rows of this process, ...]
      batch = {k: sharding.global_array(layout.batch[k], v, (s, b) + v.shape[2:])
               for k, v in local.items()}
      state, memory, metrics = train_step(state, memory, batch)
      profiler.after(step, (state, memory, metrics))
      if not bool(metrics["finite"].all()):
        # Nothing of this step is saved. Name the newest checkpoint that
        # actually restores as intact and finite, not merely the newest saved.
        del state, memory
        good = _newest_good_step(checkpointer, abstract_state, abstract_memory, layout)
        where = (f"the newest intact checkpoint is step {good}" if good is not None
                 else "no intact checkpoint is saved")
        raise NonFiniteError(
            f"non-finite loss or gradient at step {step}; {where} in {workdir}. Lower "
            "optimizer.learning_rate or optimizer.grad_clip_norm, or check the data")
      window.append(metrics)
      steps_timed += 1
      if step == start + 1:  # exclude compilation from throughput and ETA
        jax.block_until_ready(state)
        _log.info("first step (with compilation) took %.1f s", time.time() - t_last)
        t_last, steps_timed = time.time(), 0
      if step % config.log_every_steps == 0 or step == config.num_train_steps:
        m = jax.device_get(window)
        window = []
        nats = sum(float(x["nats"].sum()) for x in m)
        count = max(sum(float(x["tokens"].sum()) for x in m), 1.0)
        elapsed = time.time() - t_last
        scalars = {
            "loss": nats / count,
            bits_name: nats / count / losses.LN2,
            "reconstruction_loss": float(np.mean([x["reconstruction_loss"] for x in m])),
            "grad_norm": float(np.mean([x["grad_norm"] for x in m])),
            "learning_rate": float(learning_rate_schedule(config)(int(state.step))),
            "tokens_per_second": steps_timed * s * b * t / max(elapsed, 1e-9) if steps_timed else 0.0,
        }
        mfu = ""
        if peak and steps_timed:
          scalars["mfu"] = scalars["tokens_per_second"] * train_flops / peak
          mfu = f"  MFU {100 * scalars['mfu']:.1f}%"
        mass = [float(np.mean([x[f"attention_mass/{k}"] for x in m])) for k in BANKS]
        # Fused rope attention computes no weights, so there is no mass to log
        # (the model reports NaN); leave the scalars out rather than log NaN.
        attn = "n/a"
        if all(np.isfinite(mass)):
          scalars.update({f"attention_mass/{k}": v for k, v in zip(BANKS, mass)})
          attn = "/".join(f"{v:.2f}" for v in mass)
        eta = (end - step) * elapsed / max(steps_timed, 1)
        writer.write(step, scalars)
        _log.info(
            "step %d/%d  loss %.4f  %s %.4f  recon %.4g  attn c/m/s %s  %.0f tok/s%s  ETA %s",
            step, config.num_train_steps, scalars["loss"], bits_name, scalars[bits_name],
            scalars["reconstruction_loss"], attn, scalars["tokens_per_second"], mfu, _hms(eta))
        t_last, steps_timed = time.time(), 0
      stopping = should_stop is not None and _agree(should_stop())
      if stopping or step == end or (
          config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0):
        t_save = time.time()
        checkpointer.save(step, state, memory, _global_data_state(train_iter))
        took = time.time() - t_save
        timing["save"] += took
        timing["saves"] += 1
        t_last += took  # not training: out of the throughput and ETA
        _log.info("checkpoint of step %d: training waited %.1f s (the rest is written "
                  "in the background)", step, took)
      if stopping:
        _log.warning("stopping on request after step %d (checkpointed)", step)
        break
      if (config.eval_every_steps and step % config.eval_every_steps == 0) or step == config.num_train_steps:
        # A quick estimate (eval.max_segments per row; <= 0 for the whole
        # split): eval.py evaluates whole splits.
        t_eval = time.time()
        model = merge_params(graphdef, state_template, state.params)
        last_eval = eval_lib.evaluate(
            model, eval_docs, config, max_segments=config.eval.max_segments, mesh=mesh)
        eval_writer.write(step, last_eval)
        took = time.time() - t_eval
        timing["eval"] += took
        timing["evals"] += 1
        _log.info("eval at step %d on %s: %s  (%.1f s)", step, config.eval.split,
                  "  ".join(f"{k} {v:.4f}" for k, v in last_eval.items()), took)
        t_last = time.time()
    if step > start:
      total = time.time() - t_start
      _log.info(
          "steps %d-%d took %s: evaluation %.1f s (%d), waiting for checkpoints %.1f s "
          "(%d saves), training and the rest %.1f s", start + 1, step, _hms(total), timing["eval"],
          timing["evals"], timing["save"], timing["saves"],
          total - timing["eval"] - timing["save"])
    return last_eval


class _Profiler:
  """A JAX profiler trace of steps START..END (inclusive): started before
  the first of them this run makes, stopped once END's results are ready;
  stopped too if the run ends inside the range (an error, a stop request)."""

  def __init__(self, steps: Optional[tuple[int, int]], logdir: str):
    self.steps, self.logdir, self.tracing, self.done = steps, logdir, False, False

  def __enter__(self) -> "_Profiler":
    return self

  def before(self, step: int) -> None:
    if self.steps and not (self.tracing or self.done) and self.steps[0] <= step <= self.steps[1]:
      jax.profiler.start_trace(self.logdir)
      self.tracing = True
      _log.info("profiling steps %d-%d into %s", step, self.steps[1], self.logdir)

  def after(self, step: int, outputs) -> None:
    if self.tracing and step >= self.steps[1]:
      jax.block_until_ready(outputs)
      self._stop()
      _log.info("profile of steps up to %d written to %s", step, self.logdir)

  def _stop(self) -> None:
    self.tracing, self.done = False, True
    jax.profiler.stop_trace()

  def __exit__(self, *exc) -> None:
    if self.tracing:
      try:
        self._stop()
      except Exception as e:  # pylint: disable=broad-except
        if exc[0] is None:
          raise
        _log.warning("the profile trace could not be written: %s", e)


def _agree(flag: bool) -> bool:
  """True when any process says so, so that every process stops at one step."""
  if jax.process_count() == 1:
    return flag
  return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


_ROW_KEYS = ("epoch", "position", "offset")


def _global_data_state(it: data_lib.SegmentIterator) -> dict[str, np.ndarray]:
  """The iterator position of ALL batch rows, as one process-independent dict.

  Each process knows only its own rows (compressive/data/iterator.py); they
  are exchanged so that the checkpoint holds every row and restores onto any
  number of processes (each takes its rows back, `_local_data_state`).
  """
  state = it.get_state()
  if jax.process_count() == 1:
    return state
  rows = np.stack([state[k] for k in _ROW_KEYS]).astype(np.int32)  # [3, rows]
  starts = np.asarray(multihost_utils.process_allgather(np.int32(it.row_start)))  # [P]
  every = np.asarray(multihost_utils.process_allgather(rows))  # [P, 3, rows]
  full = np.full([3, it.batch_size], -1, np.int64)
  for p in range(every.shape[0]):
    full[:, starts[p]:starts[p] + it.num_rows] = every[p]
  if (full < 0).any():
    raise RuntimeError("the processes' batch rows do not cover the global batch")
  state.update({k: full[i] for i, k in enumerate(_ROW_KEYS)})
  state["row_start"] = np.asarray(0, np.int64)
  state["num_rows"] = np.asarray(it.batch_size, np.int64)
  return state


def _local_data_state(state: dict[str, np.ndarray], row_start: int, num_rows: int) -> dict[str, np.ndarray]:
  """This process's rows of a checkpoint's (all-row) iterator state."""
  saved_rows = len(np.asarray(state["epoch"]).reshape(-1))
  if int(state.get("row_start", 0)) != 0 or int(state.get("num_rows", saved_rows)) != saved_rows:
    raise ValueError("the checkpoint's iterator state does not hold every batch row")
  local = dict(state)
  for k in _ROW_KEYS:
    local[k] = np.asarray(state[k], np.int64).reshape(-1)[row_start:row_start + num_rows]
  local["row_start"] = np.asarray(row_start, np.int64)
  local["num_rows"] = np.asarray(num_rows, np.int64)
  return local


def _truncate_metrics(path: str, step: int) -> None:
  """Drops log records written after the checkpoint a run resumes from."""
  records = [r for r in read_jsonl(path) if r["step"] <= step]
  if os.path.exists(path):
    with open(path, "w") as f:
      import json  # pylint: disable=g-import-not-at-top
      f.writelines(json.dumps(r) + "\n" for r in records)


def _hms(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


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
  graphdef, state_template, abstract_params = abstract_model(config)
  tx = make_optimizer(config, abstract_params)
  abstract_state = abstract_train_state(config, abstract_params, tx)
  shardings = sharding.shardings(mesh, sharding.state_specs(config, abstract_params, abstract_state))
  checkpointer = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    step, state = _restore_newest(checkpointer, step, ckpt_lib.abstract(abstract_state, shardings))
  finally:
    checkpointer.close()
  model = merge_params(graphdef, state_template, state.params)
  model.eval()
  return config, model, step


def _restore_newest(checkpointer: ckpt_lib.Checkpointer, step: Optional[int], abstract_state,
                    attempts: int = 5):
  """(step, train state) of `step`, or of the newest checkpoint: a reader takes
  no lock, so a running trainer may rotate the step away while it is read;
  then the steps are listed again and the newest is read instead."""
  for attempt in range(attempts):
    wanted = checkpointer.latest_step() if step is None else step
    if wanted is None:
      raise FileNotFoundError(f"no checkpoint in {os.path.dirname(checkpointer.directory)}")
    try:
      return wanted, checkpointer.restore(wanted, abstract_state)[0]
    except ckpt_lib.MissingStepError as e:
      if step is not None or attempt == attempts - 1:
        raise
      _log.info("checkpoint %d went away while it was read (%s); reading the newest", wanted, e)
      checkpointer.reload()
  raise AssertionError("unreachable")
