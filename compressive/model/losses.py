"""Losses: the language-model loss and the compression network's losses.

Notation: B rows, T tokens, N evicted slots, d width, V vocabulary.

The compression losses (paper §3.2) train f_c only: every input they see is
behind a stop-gradient, and the layer's attention weights are read frozen.
There is no mixing coefficient: the total loss is LM + reconstruction.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

LN2 = math.log(2.0)
RECONSTRUCTION_LOSSES = ("attention", "autoencoding", "none")


def cross_entropy(
  logits: jax.Array, targets: jax.Array, mask: Optional[jax.Array] = None
) -> tuple[jax.Array, jax.Array]:
  """Summed next-token loss in nats and the number of predictions counted.

  Args:
    logits: [B, T, V].
    targets: int [B, T].
    mask: bool [B, T], True where a target is real (padding is False).

  Returns:
    (total nats, count), both float32 scalars; mean = total / count.
  """
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, T]
  if mask is None:
    mask = jnp.ones(targets.shape, bool)
  w = mask.astype(jnp.float32)
  return (nll * w).sum(), w.sum()


def _masked_mse(diff: jax.Array, weight: jax.Array) -> jax.Array:
  """Mean of squared `diff` over the positions where `weight` [B, X] is 1."""
  per_pos = jnp.square(diff.astype(jnp.float32)).reshape(diff.shape[:2] + (-1,)).mean(-1)
  total = weight.sum()
  return jnp.where(total > 0, (per_pos * weight).sum() / jnp.maximum(total, 1.0), 0.0)


def attention_reconstruction_loss(
  target: jax.Array, approx: jax.Array, old_mask: jax.Array
) -> jax.Array:
  """|| attn(h, old_mem) - attn(h, f_c(old_mem)) ||^2 (paper §3.2, Alg. 2).

  Args:
    target: [B, T, ...] content attention of the layer over the evicted
      memories (stop-gradient here).
    approx: [B, T, ...] the same attention over their compression f_c(old_mem),
      through frozen weights: the only path a gradient takes.
    old_mask: [B, N] validity of the evicted memories.

  Returns:
    Mean squared difference over the rows that evicted any valid memory;
    0 when nothing valid was evicted.
  """
  b, t = approx.shape[:2]
  row = old_mask.any(-1).astype(jnp.float32)  # [B]
  diff = jax.lax.stop_gradient(target) - approx
  return _masked_mse(diff, jnp.broadcast_to(row[:, None], (b, t)))


def autoencoding_loss(
  decode: Callable[[jax.Array], jax.Array],
  old_mem: jax.Array,
  old_mask: jax.Array,
  compressed: jax.Array,
) -> jax.Array:
  """|| old_mem - g(f_c(old_mem)) ||^2 over the valid evicted slots (§3.2)."""
  recon = decode(compressed)
  diff = jax.lax.stop_gradient(old_mem).astype(jnp.float32) - recon.astype(jnp.float32)
  return _masked_mse(diff, old_mask.astype(jnp.float32))
