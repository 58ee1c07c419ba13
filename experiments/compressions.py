"""Compressions the recall study tried that are not part of the package
(model.compression=experiments.compressions:NAME, imported on demand; the
tools run from the repository's root, where `experiments` is importable).
docs/RESULTS.md §2 gives what each measured; `attention_pool` and
`ordered_pool` were measured when the package registered them under those
names (commit 4f75bad), with this code."""

from typing import ClassVar

from flax import nnx
import jax
import jax.numpy as jnp

from compressive.model import compression, layers


class Overlap3MaxPool(compression.OverlapMaxPool):
  """overlap_max_pool over three groups (3c slots, stride c)."""

  name = "overlap3_max_pool"
  window = 3


class AttentionPool(compression.Compression):
  """Learned selection (beyond the paper): each compressed slot is its
  group's c slots averaged with softmax weights, scored from each slot's
  content (a learned query against the slot's layer norm, no parameters of
  its own) plus a learned bias per position in the group. Sharp weights keep
  one slot whole, as most-used selection does, but chosen by what the slot
  holds, not by the attention it received before it was evicted (which a
  fact not yet queried never had); the output is always a convex combination
  of real slots, in the memory's own format. Starts as mean pooling (zero
  query and biases); the attention-reconstruction loss (or the task, with
  model.memory_gradient) teaches it which slots to keep."""

  name = "attention_pool"
  POOL_HEADS: ClassVar[int] = 1  # each pools its own block of d / POOL_HEADS coordinates

  def __init__(self, rate, d_model, *, rngs, param_dtype=jnp.float32):
    super().__init__(rate, d_model, rngs=rngs, param_dtype=param_dtype)
    h = self.pool_heads(rate)
    if d_model % h:
      raise ValueError(f"{type(self).__name__} pools {h} blocks of d_model={d_model} coordinates")
    # Small and replicated: the heads on the taps' logical axis, d on the norms'.
    self.query = layers.param(
      nnx.initializers.zeros, None, (h, d_model), ("window", "norm"), param_dtype
    )
    self.position_bias = layers.param(
      self.bias_init, None, (h, rate), ("window", "window"), param_dtype
    )

  @classmethod
  def pool_heads(cls, rate: int) -> int:
    return cls.POOL_HEADS

  @staticmethod
  def bias_init(key, shape, dtype):
    del key
    return jnp.zeros(shape, dtype)

  @classmethod
  def flops_per_slot(cls, rate, d_model):
    """Every slot is scored by each pooling head (a d-long dot product) and
    weighs its d coordinates once."""
    return 2 * cls.pool_heads(rate) * d_model + 2 * d_model

  def weights(self, slots: jax.Array, mask: jax.Array) -> jax.Array:
    """[B, N, d], [B, N] -> the pooling weights [B, N / c, heads, c]."""
    g = self.groups(jnp.where(mask[..., None], slots, 0)).astype(jnp.float32)
    mean = g.mean(-1, keepdims=True)
    z = (g - mean) * jax.lax.rsqrt(((g - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
    scores = jnp.einsum("bgcd,hd->bghc", z, self.query[...].astype(jnp.float32))
    scores = scores * z.shape[-1] ** -0.5 + self.position_bias[...].astype(jnp.float32)
    return layers.masked_softmax(scores, self.groups(mask)[:, :, None, :])

  def __call__(self, slots, mask, usage):
    b, n, d = slots.shape
    h = self.query.shape[0]
    w = self.weights(slots, mask).astype(slots.dtype)  # [B, G, h, c]
    blocks = self.groups(jnp.where(mask[..., None], slots, 0)).reshape(
      b, n // self.rate, self.rate, h, d // h
    )
    out = jnp.einsum("bghc,bgchk->bghk", w, blocks).reshape(b, n // self.rate, d)
    out_mask = self.groups(mask).any(-1)
    return jnp.where(out_mask[..., None], out, 0), out_mask


class OrderedPool(AttentionPool):
  """Learned selection that keeps the order (beyond the paper): as
  attention_pool, with c pooling heads, head j choosing the slot for its own
  block of d / c coordinates, and starting (position biases of ORDER on its
  own position) with head j's block taken from the group's j-th slot. A
  feature every slot of the group shares survives whole; a feature of one
  slot survives in that slot's block, where no other slot's can overwrite it
  (max pooling keeps which features a group has, not which slot had them)."""

  name = "ordered_pool"
  ORDER = 4.0  # the initial bias of head j on position j: weight e^4 / (e^4 + c - 1)

  @classmethod
  def pool_heads(cls, rate: int) -> int:
    return rate

  @classmethod
  def bias_init(cls, key, shape, dtype):
    del key
    return cls.ORDER * jnp.eye(shape[0], shape[1], dtype=dtype)
