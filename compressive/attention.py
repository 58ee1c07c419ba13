"""Relative multi-head attention over [compressed memory; memory; segment].

Notation: B rows, T segment length, S = C + M memory slots before the segment,
K = S + T keys, H heads, D head width, d model width.

Positions are indices along the concatenation: key j (0 .. K-1) sits at j,
query i of the segment at S + i, and dist(i, j) = (S + i) - j. Valid slots are
always the newest of each bank, so this index distance is the true token
distance inside the memory. Two ways to turn it into scores
(`model.positions`):

- "relative" (default): Transformer-XL relative positions (Dai et al. 2019,
  §3.3; paper §3), with R sinusoidal and learned u, v, W_r:

      (q_i + u) . k_j  +  (q_i + v) . (W_r R_{dist(i, j)})

- "rope": rotary embeddings (Su et al. 2021): q_i is rotated by the angles of
  S + i and k_j by those of j, so rot(q_i) . rot(k_j) depends on dist(i, j)
  only. No extra parameters, and the score is a plain dot product, so the
  output can come from `jax.nn.dot_product_attention` (a fused kernel) when
  the attention weights themselves are not needed. Keys are cached unrotated
  (a slot's index shifts every segment) and rotated at use.

The causal mask is aligned bottom-right: query i sees every valid slot and
segment tokens <= i.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

_MASKED = -1e30

POSITIONS = ("relative", "rope")  # model.positions


class LayerNorm(nnx.Module):
  """LayerNorm whose parameters can be read through a stop-gradient.

  The attention-reconstruction loss must use the layer's own normalisation
  without training it (§3.2), hence `frozen`.
  """

  def __init__(self, d: int, *, param_dtype=jnp.float32, eps: float = 1e-6):
    self.scale = nnx.Param(jnp.ones((d,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((d,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array, *, frozen: bool = False) -> jax.Array:
    scale, bias = self.scale[...], self.bias[...]
    if frozen:
      scale, bias = jax.lax.stop_gradient((scale, bias))
    return _layer_norm(x, scale, bias, self.eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x, scale, bias, eps):
  return _layer_norm_fwd(x, scale, bias, eps)[0]


def _layer_norm_fwd(x, scale, bias, eps):
  xf = x.astype(jnp.float32)
  mean = xf.mean(-1, keepdims=True)
  centred = xf - mean
  rstd = jax.lax.rsqrt(jnp.square(centred).mean(-1, keepdims=True) + eps)
  xhat = centred * rstd
  return (xhat * scale + bias).astype(x.dtype), (xhat, rstd, scale)


def _layer_norm_bwd(eps, res, dy):
  """The normalisation's gradient in one pass over x's shape:
  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * scale."""
  del eps
  xhat, rstd, scale = res
  dyf = dy.astype(jnp.float32)
  g = dyf * scale
  dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
  lead = tuple(range(dy.ndim - 1))
  return dx.astype(dy.dtype), (dyf * xhat).sum(lead).astype(scale.dtype), dyf.sum(lead).astype(scale.dtype)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def dense(x: jax.Array, w: jax.Array, in_dims: int = 1) -> jax.Array:
  """x [..., *I] times w [*I, *O] -> [..., *O], as one 2-D matmul.

  Flattening the leading axes first matters on CPU: XLA's gradient of a
  [B, T, d] x [d, f] product (a weight gradient contracting over both B and
  T) runs far slower than that of the same product on [B*T, d].
  """
  lead, contract, out = x.shape[:x.ndim - in_dims], w.shape[:in_dims], w.shape[in_dims:]
  n_in = math.prod(contract)
  y = x.reshape(-1, n_in) @ w.reshape(n_in, -1)
  return y.reshape(lead + out)


def sinusoid_positions(length: int, d: int, dtype=jnp.float32) -> jax.Array:
  """R for distances length-1, ..., 1, 0 (descending): [length, d]."""
  dist = np.arange(length - 1, -1, -1, dtype=np.float32)
  inv_freq = 1.0 / (10000 ** (np.arange(0, d, 2, dtype=np.float32) / d))
  angles = dist[:, None] * inv_freq[None, :]
  # Computed here, not traced: the table depends on static sizes only, and
  # as a constant it costs the compiled step nothing.
  return jnp.asarray(np.concatenate([np.sin(angles), np.cos(angles)], -1), dtype)


@jax.custom_vjp
def masked_softmax(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """softmax(logits) over the last axis where `mask` (broadcastable) is True;
  masked entries get weight 0. A row with no True entry comes out uniform, as
  with a plain softmax over masked logits; callers ignore such rows."""
  return _masked_softmax_fwd(logits, mask)[0]


def _masked_softmax_fwd(logits, mask):
  logits = jnp.where(mask, logits, _MASKED)
  e = jnp.exp(logits - logits.max(-1, keepdims=True))
  p = e / e.sum(-1, keepdims=True)
  return p, p


def _masked_softmax_bwd(p, dp):
  """d logits = p * (dp - sum(p * dp)): one pass over the weights' shape, no
  recomputation of the normalisation (masked entries have p = 0)."""
  return p * (dp - (p * dp).sum(-1, keepdims=True)), None


masked_softmax.defvjp(_masked_softmax_fwd, _masked_softmax_bwd)


def rel_shift(x: jax.Array) -> jax.Array:
  """Turns position scores indexed by R's row into scores indexed by key.

  x[..., i, p] is the score of query i against R row p (distance K - 1 - p);
  the result [..., i, j] is the score for dist(i, j) = K - T + i - j, for every
  j <= K - T + i (entries above that diagonal are masked by the caller).
  """
  *lead, t, k = x.shape
  x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])  # [..., T, K + 1]
  x = x.reshape(*lead, k + 1, t)[..., 1:, :]  # [..., K, T]
  return x.reshape(*lead, t, k)


def rotate(x: jax.Array, index: jax.Array) -> jax.Array:
  """Rotary position embedding of x [B, N, H, D] at positions index [N].

  Channel a and a + D/2 form a pair turned by index * theta_a, with
  theta_a = 10000^(-2a / D); then rotate(q, i) . rotate(k, j) depends on i - j
  only. Computed in float32 (indices reach thousands in evaluation).
  """
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (10000 ** (jnp.arange(half, dtype=jnp.float32) * 2 / (2 * half)))
  angles = index.astype(jnp.float32)[:, None, None] * inv_freq  # [N, 1, D/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def causal_mask(key_valid: jax.Array, t: int) -> jax.Array:
  """[B, K] slot validity -> [B, 1, T, K]: valid and not in the future."""
  k = key_valid.shape[-1]
  s = k - t
  visible = jnp.arange(k)[None, :] <= (s + jnp.arange(t))[:, None]  # [T, K]
  return (visible[None] & key_valid[:, None, :])[:, None]


class RelativeAttention(nnx.Module):
  """Pre-norm relative multi-head attention of one layer."""

  def __init__(
      self,
      d_model: int,
      num_heads: int,
      *,
      dropout_rate: float,
      rngs: nnx.Rngs,
      positions: str = "relative",
      dtype=jnp.float32,
      param_dtype=jnp.float32,
  ):
    if positions not in POSITIONS:
      raise ValueError(f"positions={positions!r}; choose one of {', '.join(POSITIONS)}")
    h, hd = num_heads, d_model // num_heads
    self.positions = positions
    self.num_heads, self.head_dim = h, hd
    init = nnx.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
    self.norm = LayerNorm(d_model, param_dtype=param_dtype)
    self.wq = nnx.Param(init(rngs.params(), (d_model, h, hd), param_dtype))
    self.wk = nnx.Param(init(rngs.params(), (d_model, h, hd), param_dtype))
    self.wv = nnx.Param(init(rngs.params(), (d_model, h, hd), param_dtype))
    if positions == "relative":  # rope has no position parameters
      # Drawn before wo, so that relative models initialise as they always did.
      self.wr = nnx.Param(init(rngs.params(), (d_model, h, hd), param_dtype))
    self.wo = nnx.Param(
        nnx.initializers.lecun_normal(in_axis=(0, 1), out_axis=2)(
            rngs.params(), (h, hd, d_model), param_dtype))
    if positions == "relative":
      self.u = nnx.Param(jnp.zeros((h, hd), param_dtype))
      self.v = nnx.Param(jnp.zeros((h, hd), param_dtype))
    self.dropout = nnx.Dropout(dropout_rate, deterministic=False)
    self.dtype = dtype
    self.scale = hd**-0.5

  def _w(self, name: str, frozen: bool = False) -> jax.Array:
    w = getattr(self, name)[...].astype(self.dtype)
    return jax.lax.stop_gradient(w) if frozen else w

  def __call__(
      self,
      x: jax.Array,
      past: jax.Array,
      past_valid: jax.Array,
      positions: jax.Array,
      *,
      dropout_rng: Optional[jax.Array] = None,
      past_kv: Optional[tuple[jax.Array, jax.Array]] = None,
      need_weights: bool = True,
  ) -> tuple[jax.Array, Optional[jax.Array], tuple[jax.Array, jax.Array, jax.Array]]:
    """Attends from the segment over [past; segment].

    Args:
      x: [B, T, d] the segment's layer inputs (not yet normalised).
      past: [B, S, d] [compressed memory; memory] slots (layer inputs).
      past_valid: [B, S] bool.
      positions: [K, d] sinusoids for distances K-1 .. 0 (relative mode);
        unused, and may be None, in rope mode.
      dropout_rng: key for attention dropout; None when deterministic.
      past_kv: the keys and values [B, S, H, D] of `past`, when cached
        (evaluation: the weights do not change, so each slot's are computed
        once, when it enters the memory); `past` is then not read.
      need_weights: False lets rope mode compute the output with
        `jax.nn.dot_product_attention`, which never materialises the weights
        (unless attention dropout is on: the fused call has no dropout). The
        relative mode always computes them.

    Returns:
      The attention output [B, T, d], the attention weights [B, H, T, K]
      (None when the fused call made the output), and (q [B, T, H, D],
      k, v [B, K, H, D]) for reuse by the reconstruction loss: content only,
      so unrotated in rope mode.
    """
    b, t, _ = x.shape
    q = self.query(x)
    if past_kv is None:
      k, v = self.keys_values(jnp.concatenate([past, x], axis=1))  # [B, K, H, D]
    else:
      k_x, v_x = self.keys_values(x)
      k = jnp.concatenate([past_kv[0].astype(k_x.dtype), k_x], axis=1)
      v = jnp.concatenate([past_kv[1].astype(v_x.dtype), v_x], axis=1)
    valid = jnp.concatenate([past_valid, jnp.ones((b, t), bool)], axis=1)
    mask = causal_mask(valid, t)  # [B, 1, T, K]
    # The score and value products run head-major ([B, H, T, D] against
    # [B, H, K, D]): with the head axis next to the batch axis they are plain
    # batched matmuls, and the [B, H, T, K] scores never need a transpose.
    heads = lambda a: jnp.swapaxes(a, 1, 2)  # [B, N, H, D] <-> [B, H, N, D]
    if self.positions == "rope":
      kk = k.shape[1]
      q_rot = rotate(q, kk - t + jnp.arange(t))  # queries at S + i
      k_rot = rotate(k, jnp.arange(kk))  # keys at j
      if not need_weights and dropout_rng is None:
        out = jax.nn.dot_product_attention(q_rot, k_rot, v, mask=mask, scale=self.scale)
        return dense(out, self._w("wo"), 2), None, (q, k, v)
      logits = jnp.einsum("bhte,bhke->bhtk", heads(q_rot) * self.scale, heads(k_rot))
      logits = logits.astype(jnp.float32)
    else:
      r = jnp.swapaxes(self.position_keys(positions), 0, 1)  # [H, K, D]
      # The 1/sqrt(D) scale goes on the [B, H, T, D] queries, not on the K
      # times larger scores (nor, in the backward pass, on their gradient).
      content = jnp.einsum("bhte,bhke->bhtk", heads((q + self._w("u")) * self.scale), heads(k))
      # Position scores of all rows at once, one [B*T, D] x [D, K] product per
      # head, laid out [H, B, T, K] so that neither the product nor the shift
      # needs a transpose; only whole [T, K] blocks move to [B, H, T, K].
      qv = jnp.transpose((q + self._w("v")) * self.scale, (2, 0, 1, 3))
      qv = qv.reshape(self.num_heads, b * t, -1)
      position = jax.lax.dot_general(qv, r, (((2,), (2,)), ((0,), (0,))))  # [H, B*T, K]
      position = rel_shift(position.reshape(self.num_heads, b, t, -1)).swapaxes(0, 1)
      logits = (content + position).astype(jnp.float32)
    probs = masked_softmax(logits, mask)  # [B, H, T, K]
    dropped = probs
    if dropout_rng is not None:
      dropped = self.dropout(probs, rngs=dropout_rng)
    out = jnp.einsum("bhtk,bhke->bhte", dropped.astype(self.dtype), heads(v))
    return dense(jnp.swapaxes(out, 1, 2), self._w("wo"), 2), probs, (q, k, v)

  def query(self, x: jax.Array) -> jax.Array:
    """[B, T, d] layer inputs -> queries [B, T, H, D]."""
    return dense(self.norm(x), self._w("wq"))

  def keys_values(self, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, N, d] layer inputs (memory or segment) -> keys, values [B, N, H, D].

    Normalisation is per slot, so keys of memory slots can be computed once
    and cached while the weights do not change (streaming generation).
    """
    n = self.norm(slots)
    return dense(n, self._w("wk")), dense(n, self._w("wv"))

  def position_keys(self, positions: jax.Array) -> jax.Array:
    """Sinusoids [K, d] for distances K-1 .. 0 -> W_r R, [K, H, D].

    Rope mode has no W_r: an empty [0, H, D] (attend_one does not read it).
    """
    if self.positions == "rope":
      return jnp.zeros((0, self.num_heads, self.head_dim), self.dtype)
    return dense(positions.astype(self.dtype), self._w("wr"))

  def attend_one(
      self, q: jax.Array, k: jax.Array, v: jax.Array, r: jax.Array,
      valid: jax.Array, index: jax.Array,
  ) -> jax.Array:
    """One query at key position `index` (a traced scalar) over cached keys.

    q [B, H, D]; k, v [B, K, H, D]; r [K, H, D] (distances K-1 .. 0; unused
    in rope mode, where q and the unrotated k are rotated here); valid
    [B, K]. Keys after `index` are masked. Returns the output [B, d], equal to
    that query's row of `__call__` on the same keys.
    """
    kk = k.shape[1]
    j = jnp.arange(kk)
    dist = index - j  # [K]
    if self.positions == "rope":
      q_rot = rotate(q[:, None], jnp.reshape(index, (1,)))[:, 0]
      logits = jnp.einsum("bhe,bkhe->bhk", q_rot * self.scale, rotate(k, j)).astype(jnp.float32)
    else:
      content = jnp.einsum("bhe,bkhe->bhk", (q + self._w("u")) * self.scale, k)
      r_at = jnp.take(r, jnp.clip(kk - 1 - dist, 0, kk - 1), axis=0)  # [K, H, D]
      position = jnp.einsum("bhe,khe->bhk", (q + self._w("v")) * self.scale, r_at)
      logits = (content + position).astype(jnp.float32)
    visible = valid & (dist >= 0)[None, :]
    logits = jnp.where(visible[:, None, :], logits, _MASKED)
    probs = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
    out = jnp.einsum("bhk,bkhe->bhe", probs, v)
    return jnp.einsum("bhe,hed->bd", out, self._w("wo"))

  def content_attention(
      self, q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array
  ) -> jax.Array:
    """Content-only attention (no positions, no causal mask), §3.2.

    Used only by the attention-reconstruction loss, from queries q [B, T, H, D]
    over keys and values [B, N, H, D] with validity [B, N]. Returns
    [B, T, H, D]. The caller makes the queries and the layer's weights
    stop-gradient (see `frozen_keys_values`).
    """
    logits = jnp.einsum("bthe,bnhe->bhtn", q * self.scale, k).astype(jnp.float32)
    probs = masked_softmax(logits, valid[:, None, None, :]).astype(self.dtype)
    return jnp.einsum("bhtn,bnhe->bthe", probs, v)

  def frozen_keys_values(self, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B, N, H, D] of `slots [B, N, d]` through this layer's
    normalisation and projections read behind a stop-gradient: a gradient
    reaches the slots, never the weights (§3.2)."""
    n = self.norm(slots, frozen=True)
    return dense(n, self._w("wk", frozen=True)), dense(n, self._w("wv", frozen=True))
