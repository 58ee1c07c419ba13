"""Layer helpers shared by the attention, the compression and the model.

Every parameter is made by `param`, which records its logical axes (flax
NNX sharding metadata, e.g. ('embed', 'heads', 'head_dim')); `config.mesh`
maps logical axes to mesh axes (compressive/scale/sharding.py). A parameter made any
other way has no axes, and a test fails.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

from flax import nnx
import jax
import jax.numpy as jnp

_MASKED = -1e30


def param(
  init: Callable,
  rngs: nnx.Rngs | None,
  shape: Sequence[int],
  axes: Sequence[str],
  dtype: jax.typing.DTypeLike = jnp.float32,
  *,
  rows: int | None = None,
) -> nnx.Param:
  """A parameter of `shape` drawn by `init(key, shape, dtype)` (rngs None: a
  constant init such as zeros, which draws nothing), with one logical axis
  name per dimension.

  `rows`: the parameter is drawn as the matrix it acts as, its first `rows`
  axes flattened into the matrix's rows and the others into its columns
  (`init` sees that 2-D shape: a fan-in initializer sees the fan-in and
  fan-out of the N-D one with in_axis = the first `rows` axes), then reshaped
  to `shape`. The numbers are the same: JAX's threefry numbers the elements
  of a draw by their row-major index, whatever the shape
  (tests/model/test_layers.py checks it against the N-D initializers). What
  changes is the compile time on XLA:CPU, which compiles a random draw of
  rank 3 or 4 far more slowly than one of rank 2, by an order of magnitude
  for the draw alone. The parameter's own sharding is
  unchanged (it is set on the reshaped value; tests/scale/test_sharding.py
  trains on 8-device meshes); whether XLA partitions the matrix draw or draws
  it whole and slices is the partitioner's choice, not measured here.
  """
  if len(axes) != len(shape):
    raise ValueError(f"{len(axes)} logical axes {tuple(axes)} for shape {tuple(shape)}")
  shape = tuple(shape)
  key = None if rngs is None else rngs.params()
  if rows is None:
    value = init(key, shape, dtype)
  else:
    if not 0 < rows < len(shape):
      raise ValueError(f"rows={rows} for shape {shape}: between 1 and {len(shape) - 1}")
    matrix = (math.prod(shape[:rows]), math.prod(shape[rows:]))
    value = init(key, matrix, dtype).reshape(shape)
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def dense(x: jax.Array, w: jax.Array, in_dims: int = 1) -> jax.Array:
  """x [..., *I] times w [*I, *O] -> [..., *O], as one 2-D matmul.

  Flattening the leading axes first matters on CPU: XLA's gradient of a
  [B, T, d] x [d, f] product (a weight gradient contracting over both B and
  T) runs far slower than that of the same product on [B*T, d].
  """
  lead, contract, out = x.shape[: x.ndim - in_dims], w.shape[:in_dims], w.shape[in_dims:]
  n_in = math.prod(contract)
  y = x.reshape(-1, n_in) @ w.reshape(n_in, -1)
  return y.reshape(lead + out)


class LayerNorm(nnx.Module):
  """LayerNorm whose parameters can be read through a stop-gradient.

  The attention-reconstruction loss must use the layer's own normalisation
  without training it (docs/PAPER.md §Attention-reconstruction loss), hence
  `frozen`.
  """

  def __init__(
    self, d: int, *, param_dtype: jax.typing.DTypeLike = jnp.float32, eps: float = 1e-6
  ) -> None:
    self.scale = param(nnx.initializers.ones, None, (d,), ("norm",), param_dtype)
    self.bias = param(nnx.initializers.zeros, None, (d,), ("norm",), param_dtype)
    self.eps = eps

  def __call__(self, x: jax.Array, *, frozen: bool = False) -> jax.Array:
    scale, bias = self.scale[...], self.bias[...]
    if frozen:
      scale, bias = jax.lax.stop_gradient((scale, bias))
    return _layer_norm(x, scale, bias, self.eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
  return _layer_norm_fwd(x, scale, bias, eps)[0]


def _layer_norm_fwd(
  x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
  xf = x.astype(jnp.float32)
  centred = xf - xf.mean(-1, keepdims=True)
  rstd = jax.lax.rsqrt(jnp.square(centred).mean(-1, keepdims=True) + eps)
  xhat = centred * rstd
  return (xhat * scale + bias).astype(x.dtype), (xhat, rstd, scale)


def _layer_norm_bwd(
  eps: float, res: tuple[jax.Array, jax.Array, jax.Array], dy: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The normalisation's gradient in one pass over x's shape:
  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * scale."""
  del eps
  xhat, rstd, scale = res
  dyf = dy.astype(jnp.float32)
  g = dyf * scale
  dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
  lead = tuple(range(dy.ndim - 1))
  return (
    dx.astype(dy.dtype),
    (dyf * xhat).sum(lead).astype(scale.dtype),
    dyf.sum(lead).astype(scale.dtype),
  )


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@jax.custom_vjp
def masked_softmax(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """softmax(logits) over the last axis where `mask` (broadcastable) is True;
  masked entries get weight 0. A row with no True entry comes out uniform, as
  with a plain softmax over masked logits; callers ignore such rows."""
  return _masked_softmax_fwd(logits, mask)[0]


def _masked_softmax_fwd(logits: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  logits = jnp.where(mask, logits, _MASKED)
  e = jnp.exp(logits - logits.max(-1, keepdims=True))
  p = e / e.sum(-1, keepdims=True)
  return p, p


def _masked_softmax_bwd(p: jax.Array, dp: jax.Array) -> tuple[jax.Array, None]:
  """d logits = p * (dp - sum(p * dp)): one pass over the weights' shape, no
  recomputation of the normalisation (masked entries have p = 0)."""
  return p * (dp - (p * dp).sum(-1, keepdims=True)), None


masked_softmax.defvjp(_masked_softmax_fwd, _masked_softmax_bwd)


class FeedForward(nnx.Module):
  """Position-wise GELU MLP, d -> d_ff -> d."""

  def __init__(
    self,
    d_model: int,
    d_ff: int,
    *,
    rngs: nnx.Rngs,
    dtype: jax.typing.DTypeLike,
    param_dtype: jax.typing.DTypeLike,
  ) -> None:
    init, zeros = nnx.initializers.lecun_normal(), nnx.initializers.zeros
    self.w1 = param(init, rngs, (d_model, d_ff), ("embed", "mlp"), param_dtype)
    self.b1 = param(zeros, None, (d_ff,), ("mlp",), param_dtype)
    self.w2 = param(init, rngs, (d_ff, d_model), ("mlp", "embed"), param_dtype)
    self.b2 = param(zeros, None, (d_model,), ("norm",), param_dtype)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    c = lambda p: p[...].astype(self.dtype)
    h = jax.nn.gelu(dense(x, c(self.w1)) + c(self.b1))
    return dense(h, c(self.w2)) + c(self.b2)
