"""Compression functions f_c (paper §3.1, Table 5), by name.

Notation: B rows, N evicted slots (a multiple of the rate c), d width.

Every function maps the evicted block `[B, N, d]` with its validity mask to
`N / c` compressed slots and their validity. A compressed slot is valid when
any of its source slots is; invalid sources never contribute to a valid
slot's value. All learnable parameters of compression (and the auto-encoder's
decoder g, which exists only to train f_c) live in `Compressor`, which the
model stores under the name `compressor` in every layer, so that optimisers
and tests can find them.
"""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp

from compressive.attention import dense

COMPRESSIONS = ("max_pool", "mean_pool", "conv", "dilated_conv", "most_used")


def _groups(x: jax.Array, rate: int) -> jax.Array:
  """[B, N, ...] -> [B, N / c, c, ...]."""
  return x.reshape((x.shape[0], x.shape[1] // rate, rate) + x.shape[2:])


def dilated_layers(rate: int) -> int:
  """Kernel-2 dilated layers (dilations 1, 2, 4, ...) needed so that the
  receptive field (2 ** layers) covers a whole group of c slots."""
  return max(1, math.ceil(math.log2(rate))) if rate > 1 else 0


class Compressor(nnx.Module):
  """f_c with rate c, plus the auto-encoder's decoder g when that loss is used."""

  def __init__(
      self,
      kind: str,
      rate: int,
      d_model: int,
      *,
      autoencoder: bool,
      rngs: nnx.Rngs,
      param_dtype=jnp.float32,
  ):
    if kind not in COMPRESSIONS:
      raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")
    self.kind = kind
    self.rate = rate
    d, c = d_model, rate
    init = nnx.initializers.normal(0.02)
    if kind == "conv":
      # 1D convolution, kernel = stride = c. Starts as mean pooling (plus a
      # little noise) so that early compressed memories are not garbage.
      eye = jnp.eye(d, dtype=param_dtype)[None] / c
      self.kernel = nnx.Param(eye + init(rngs.params(), (c, d, d), param_dtype))
      self.bias = nnx.Param(jnp.zeros((d,), param_dtype))
    elif kind == "dilated_conv":
      # Causal kernel-2 convolutions with dilations 1, 2, 4, ... over the
      # evicted block, residual; the output at the last slot of each group is
      # kept. The receptive field 2**n >= c covers the whole group, so every
      # evicted slot reaches the compressed memory.
      n = dilated_layers(c)
      self.kernel = nnx.Param(init(rngs.params(), (n, 2, d, d), param_dtype))
      self.bias = nnx.Param(jnp.zeros((n, d), param_dtype))
    if autoencoder:
      # g: a transposed convolution (kernel = stride = c) back to c slots.
      self.decoder_kernel = nnx.Param(
          nnx.initializers.lecun_normal()(rngs.params(), (d, c * d), param_dtype))
      self.decoder_bias = nnx.Param(jnp.zeros((c * d,), param_dtype))

  def __call__(
      self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Compresses `slots [B, N, d]` (validity `mask [B, N]`, attention
    `usage [B, N]`) into `[B, N / c, d]` and its validity `[B, N / c]`."""
    c = self.rate
    n = slots.shape[1]
    if n % c:
      raise ValueError(f"cannot compress {n} slots at rate {c}: not a multiple")
    dtype = slots.dtype
    x = jnp.where(mask[..., None], slots, 0)
    gmask = _groups(mask, c)  # [B, N/c, c]
    out_mask = gmask.any(-1)
    if self.kind == "mean_pool":
      count = jnp.maximum(gmask.sum(-1, keepdims=True), 1).astype(dtype)
      out = _groups(x, c).sum(2) / count
    elif self.kind == "max_pool":
      neg = jnp.finfo(dtype).min
      out = jnp.where(gmask[..., None], _groups(slots, c), neg).max(2)
      out = jnp.where(out_mask[..., None], out, 0)
    elif self.kind == "conv":
      out = dense(_groups(x, c), self.kernel[...].astype(dtype), 2)
      out = out + self.bias[...].astype(dtype)
    elif self.kind == "dilated_conv":
      h = x
      kernel = self.kernel[...].astype(dtype)
      bias = self.bias[...].astype(dtype)
      for i in range(kernel.shape[0]):
        dil = 2**i
        shifted = jnp.pad(h, ((0, 0), (dil, 0), (0, 0)))[:, :n]  # h[t - dil]
        y = dense(shifted, kernel[i, 0]) + dense(h, kernel[i, 1]) + bias[i]
        h = h + jax.nn.gelu(y)
      out = h[:, c - 1::c]
    elif self.kind == "most_used":
      # Keep the N / c slots that received the most attention (after DNC's
      # usage-based freeing), in their original temporal order.
      score = jnp.where(mask, usage, -jnp.inf)
      _, idx = jax.lax.top_k(score, n // c)
      idx = jnp.sort(idx, axis=-1)  # [B, N/c]
      out = jnp.take_along_axis(slots, idx[..., None], axis=1)
      out_mask = jnp.take_along_axis(mask, idx, axis=1)
      out = jnp.where(out_mask[..., None], out, 0)
    else:  # pragma: no cover - rejected in __init__
      raise AssertionError(self.kind)
    return out.astype(dtype), out_mask

  def decode(self, compressed: jax.Array) -> jax.Array:
    """g: [B, N / c, d] -> [B, N, d] (auto-encoding loss only)."""
    b, g, d = compressed.shape
    dtype = compressed.dtype
    y = dense(compressed, self.decoder_kernel[...].astype(dtype))
    y = y + self.decoder_bias[...].astype(dtype)
    return y.reshape(b, g * self.rate, d)
