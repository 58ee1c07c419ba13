"""Gradient accumulation: one segment's gradient summed over micro-batches.

With `train.grad_accum_steps` = A > 1 the train step (step.py) computes each
segment's gradient in A micro-batches of B / A rows, one after the other
(the activation memory of B / A rows), and sums them into the full batch's
gradient for ONE optimizer update. Held here apart from the step: the
split of the rows (and of the memory's) into micro-batches that stay on the
devices that hold them, and the weights that make the sum the full
batch's loss, LM and reconstruction alike.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from compressive.model import memory as memory_lib

if TYPE_CHECKING:  # step.py's types, named for the type checker only (step.py imports this)
  from compressive.training.step import Aux, Batch, Forward, Gradients, Layout


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
  y = x.reshape(shape[:axis] + (dp, parts, m) + shape[axis + 1 :])
  y = jnp.moveaxis(y, axis + 1, 0)  # [parts, ..., dp, m, ...]
  return y.reshape((parts,) + shape[:axis] + (dp * m,) + shape[axis + 1 :])


def _merge_rows(y: jax.Array, axis: int, dp: int) -> jax.Array:
  """The inverse of `_split_rows`: [parts, ..., B / parts, ...] -> [..., B, ...]."""
  parts, shape = y.shape[0], y.shape[1:]
  m = shape[axis] // dp
  z = y.reshape((parts,) + shape[:axis] + (dp, m) + shape[axis + 1 :])
  z = jnp.moveaxis(z, 0, axis + 1)  # [..., dp, parts, m, ...]
  return z.reshape(shape[:axis] + (dp * parts * m,) + shape[axis + 1 :])


def _reconstruction_row_weights(
  kind: str, memory: memory_lib.Memory, start_of_sequence: jax.Array, t: int
) -> jax.Array:
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


def accumulated(
  parts: int, layout: Optional[Layout], reconstruction: str
) -> Callable[[Forward, Any, Batch, memory_lib.Memory, jax.Array], Gradients]:
  """`accumulated_gradients` as the train step calls it, gradients(forward,
  params, seg, memory, rng): over `parts` micro-batches of the rows that
  `layout` splits (the data split read here, once, not per trace), with
  the model's `reconstruction` loss (model.reconstruction_loss)."""
  dp = _data_split(layout)

  def gradients(
    forward: Forward, params: Any, seg: Batch, memory: memory_lib.Memory, rng: jax.Array
  ) -> Gradients:
    return accumulated_gradients(
      forward,
      params,
      seg,
      memory,
      rng,
      parts,
      dp,
      layout,
      reconstruction,
    )

  return gradients


def _micro_batches(
  seg: Batch, memory: memory_lib.Memory, parts: int, dp: int, layout: Optional[Layout]
) -> tuple[Batch, memory_lib.Memory]:
  """(segment, memory) split into `parts` micro-batches of rows, [parts, ...]
  (`_split_rows`); with a `layout`, each micro-batch's rows laid out over
  the mesh as the whole batch's are."""
  micro_seg = {k: _split_rows(v, 0, parts, dp) for k, v in seg.items()}
  micro_memory = jax.tree.map(lambda x: _split_rows(x, 1, parts, dp), memory)
  if layout is not None:  # [parts, rows, ...]: the rows split as the batch's
    micro_seg = jax.lax.with_sharding_constraint(micro_seg, {k: layout.batch[k] for k in micro_seg})
    micro_memory = jax.lax.with_sharding_constraint(
      micro_memory,
      jax.tree.map(
        lambda s: NamedSharding(s.mesh, jax.sharding.PartitionSpec(None, *s.spec)), layout.memory
      ),
    )
  return micro_seg, micro_memory


def accumulated_gradients(
  forward: Forward,
  params: Any,
  seg: Batch,
  memory: memory_lib.Memory,
  rng: jax.Array,
  parts: int,
  dp: int,
  layout: Optional[Layout],
  reconstruction: str,
) -> Gradients:
  """(grads, new memory, scalars, nats, count) of one segment, as the full
  batch gives them, computed in `parts` micro-batches by a `lax.scan`.

  The loss is LM + reconstruction (step.make_train_step). The LM loss is
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
  micro_seg, micro_memory = _micro_batches(seg, memory, parts, dp, layout)

  def micro(
    grads: Any, xs: tuple[jax.Array, Batch, memory_lib.Memory, jax.Array]
  ) -> tuple[Any, Aux]:
    k, seg_k, memory_k, coefficient = xs

    def loss_fn(params: Any) -> tuple[jax.Array, Aux]:
      nats, count, new_memory, scalars = forward(
        params, seg_k, memory_k, jax.random.fold_in(rng, k)
      )
      return (
        nats / total + coefficient * scalars["reconstruction_loss"],
        (new_memory, scalars, nats, count),
      )

    g, out = jax.grad(loss_fn, has_aux=True)(params)
    grads = jax.tree.map(jnp.add, grads, g)
    if layout is not None:
      grads = jax.lax.with_sharding_constraint(grads, layout.state.params)
    return grads, out

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, (new_memory, scalars, nats, count) = jax.lax.scan(
    micro, zeros, (jnp.arange(parts), micro_seg, micro_memory, coefficients)
  )
  new_memory = jax.tree.map(lambda y: _merge_rows(y, 1, dp), new_memory)
  scalars = {
    k: (jnp.sum(v * coefficients) if k == "reconstruction_loss" else jnp.mean(v))
    for k, v in scalars.items()
  }
  return grads, new_memory, scalars, nats.sum(), count.sum()
