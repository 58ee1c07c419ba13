"""Compression functions f_c (docs/PAPER.md §Compression functions), as a
registry, and the compressor that pushes their output into the compressed
memory and computes their training loss.

Notation: B rows, N evicted slots (a multiple of the rate c), d width.

Every function maps the evicted block `[B, N, d]` with its validity mask (and
the attention each slot received, for those that declare `needs_usage`) to
`N / c` compressed slots and their validity. A compressed slot is valid when
any of its source slots is; invalid sources never contribute to a valid slot's
value. A new compression is one `Compression` subclass decorated with
`@register`; its parameters are made with `layers.param`, which records their
logical axes, and it declares its forward FLOPs (`flops_per_slot`), which the
MFU count reads (docs/DESIGN.md §Adding a compression). One defined outside
this package is named `module:Name` (`resolve`) and imported on demand.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, ClassVar

from flax import nnx
import jax
import jax.numpy as jnp

from compressive import plugins
from compressive.errors import ConfigError
from compressive.model import losses
from compressive.model import memory as memory_lib
from compressive.model.layers import dense, param

if TYPE_CHECKING:  # the layer's attention, read here; compression never imports it to run
  from compressive.model.attention import RelativeAttention

COMPRESSIONS: dict[str, type["Compression"]] = {}  # model.compression -> class


def register(cls: type["Compression"]) -> type["Compression"]:
  """Class decorator: makes `cls` selectable as `model.compression=cls.name`."""
  if cls.name in COMPRESSIONS and COMPRESSIONS[cls.name] is not cls:
    raise ValueError(f"compression {cls.name!r} is already registered")
  COMPRESSIONS[cls.name] = cls
  return cls


def resolve(name: str) -> type["Compression"]:
  """The class that `model.compression=name` selects: a registered name, or
  `module:Name` for one defined outside this package, whose module is
  imported now (so a config that names it, config.json included, imports it
  again wherever it is read). ConfigError (one line) when it cannot be."""
  return plugins.lookup(
    "model.compression",
    name,
    COMPRESSIONS,
    lambda c: isinstance(c, type) and issubclass(c, Compression),
    "a subclass of compressive.model.compression.Compression",
  )


def declared_flops(name: str, rate: int, d_model: int) -> float:
  """`flops_per_slot(rate, d_model)` of the compression `model.compression=
  name` selects, held to its contract: a finite number >= 0. One defined
  outside this package that breaks it, or raises, is one ConfigError naming
  it (the experiment's check calls this at start-up); a built-in one's error
  is a bug and keeps its traceback."""
  cls = resolve(name)
  where = f"model.compression={name!r} ({cls.__module__}.{cls.__name__})"
  try:
    value = cls.flops_per_slot(rate, d_model)
  except Exception as e:
    if cls.__module__.startswith("compressive."):
      raise
    raise ConfigError(
      f"{where}: its flops_per_slot({rate}, {d_model}) raised "
      f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    ) from e
  if (
    isinstance(value, bool)
    or not isinstance(value, numbers.Real)
    or not (math.isfinite(value) and value >= 0)
  ):
    raise ConfigError(
      f"{where}: its flops_per_slot({rate}, {d_model}) returned "
      f"{type(value).__name__} {value!r:.80}; it returns a finite number >= 0 "
      "(forward FLOPs per evicted slot)"
    )
  return float(value)


class Compression(nnx.Module):
  """f_c at rate c. Subclasses set `name` and implement `__call__`."""

  name: ClassVar[str]
  needs_usage: ClassVar[bool] = False  # reads the attention each slot received
  # Groups of c evicted slots each compressed slot reads: its own, and
  # `window - 1` groups before it in the same eviction. A layer's temporal
  # range is n_m + c * (n_cm + window - 1) tokens (paper §3: window 1).
  window: ClassVar[int] = 1

  def __init__(
    self,
    rate: int,
    d_model: int,
    *,
    rngs: nnx.Rngs,
    param_dtype: jax.typing.DTypeLike = jnp.float32,
  ) -> None:
    del d_model, rngs, param_dtype  # parameter-free functions need neither
    self.rate = rate

  def __call__(
    self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """slots [B, N, d], mask [B, N], usage [B, N] -> [B, N / c, d], [B, N / c]."""
    raise NotImplementedError

  @classmethod
  def flops_per_slot(cls, rate: int, d_model: int) -> float:
    """Forward FLOPs per evicted slot, counted as compressive/scale/flops.py
    counts (matmuls only, 2 per multiply-add): the MFU reads this, and a
    layer evicts as many slots per segment as the segment has tokens, so it
    is also the compression's FLOPs per token. The base class does no
    matmul; a subclass that does overrides this."""
    del rate, d_model
    return 0

  def groups(self, x: jax.Array) -> jax.Array:
    """[B, N, ...] -> [B, N / c, c, ...]."""
    return x.reshape((x.shape[0], x.shape[1] // self.rate, self.rate) + x.shape[2:])


@register
class MaxPool(Compression):
  name = "max_pool"

  def __call__(
    self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    gmask = self.groups(mask)
    out_mask = gmask.any(-1)
    out = jnp.where(gmask[..., None], self.groups(slots), jnp.finfo(slots.dtype).min).max(2)
    return jnp.where(out_mask[..., None], out, 0), out_mask


@register
class OverlapMaxPool(Compression):
  """Max pooling over overlapping windows (beyond the paper): each
  compressed slot is the maximum over its own group of c slots and the
  group before it in the same eviction (2c slots, stride c; the eviction's
  first group has no group before it and pools its own c). A fact split
  across two groups by the eviction's fixed boundaries is whole in the
  second group's window: with plain max pooling a value byte shares its
  slot with the fact's key in only some alignments, and recall past the
  uncompressed memory finds the value through the key's bytes
  (docs/RESULTS.md §2). Every evicted slot still reaches its own group's
  compressed slot, and none reaches a later eviction's."""

  name = "overlap_max_pool"
  window = 2

  def __call__(
    self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    gmask = self.groups(mask)  # [B, G, c]
    low = jnp.finfo(slots.dtype).min
    own = jnp.where(gmask[..., None], self.groups(slots), low).max(2)  # [B, G, d]
    out = own
    for k in range(1, self.window):  # the k-th group before, where the eviction has one
      out = jnp.maximum(out, jnp.pad(own[:, :-k], ((0, 0), (k, 0), (0, 0)), constant_values=low))
    out_mask = gmask.any(-1)
    return jnp.where(out_mask[..., None], out, 0), out_mask


@register
class MeanPool(Compression):
  name = "mean_pool"

  def __call__(
    self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    gmask = self.groups(mask)
    count = jnp.maximum(gmask.sum(-1, keepdims=True), 1).astype(slots.dtype)
    return self.groups(jnp.where(mask[..., None], slots, 0)).sum(2) / count, gmask.any(-1)


@register
class Conv(Compression):
  """1D convolution, kernel = stride = c. Starts as mean pooling plus noise
  of std NOISE / (c * sqrt(d)): on inputs of independent coordinates, the
  noise is then ~NOISE of the mean-pooled signal at every width and rate (a
  fixed std would grow like c * sqrt(d): N(0, 0.02^2) is 1.9 times the signal
  at d = 1024, c = 3)."""

  name = "conv"
  NOISE = 0.02  # the initial noise relative to the mean-pooling signal

  def __init__(
    self,
    rate: int,
    d_model: int,
    *,
    rngs: nnx.Rngs,
    param_dtype: jax.typing.DTypeLike = jnp.float32,
  ) -> None:
    super().__init__(rate, d_model, rngs=rngs, param_dtype=param_dtype)
    # Drawn as the (c*d, d) matrix of the c stacked taps (see `param`).
    eye = jnp.tile(jnp.eye(d_model, dtype=param_dtype) / rate, (rate, 1))
    noise = nnx.initializers.normal(self.NOISE / (rate * math.sqrt(d_model)))
    init = lambda key, shape, dtype: eye + noise(key, shape, dtype)
    self.kernel = param(
      init, rngs, (rate, d_model, d_model), ("window", "embed", "embed_out"), param_dtype, rows=2
    )
    self.bias = param(nnx.initializers.zeros, None, (d_model,), ("norm",), param_dtype)

  @classmethod
  def flops_per_slot(cls, rate: int, d_model: int) -> float:
    """N / c compressed slots, each a c*d -> d product: 2*d*d per slot."""
    del rate
    return 2 * d_model * d_model

  def __call__(
    self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    x = jnp.where(mask[..., None], slots, 0)
    out = dense(self.groups(x), self.kernel[...].astype(slots.dtype), 2)
    return out + self.bias[...].astype(slots.dtype), self.groups(mask).any(-1)


def dilated_layers(rate: int) -> int:
  """Kernel-2 dilated layers (dilations 1, 2, 4, ...) needed so that the
  receptive field (2 ** layers) covers a whole group of c slots."""
  return max(1, math.ceil(math.log2(rate))) if rate > 1 else 0


@register
class DilatedConv(Compression):
  """Causal kernel-2 convolutions with dilations 1, 2, 4, ... inside each
  group of c slots, residual; the output at the group's last slot is kept.
  A tap that would reach before the group's first slot reads zeros, so no
  group sees another for any c; the receptive field 2**n >= c covers the
  whole group, so every evicted slot reaches its compressed slot."""

  name = "dilated_conv"

  def __init__(
    self,
    rate: int,
    d_model: int,
    *,
    rngs: nnx.Rngs,
    param_dtype: jax.typing.DTypeLike = jnp.float32,
  ) -> None:
    super().__init__(rate, d_model, rngs=rngs, param_dtype=param_dtype)
    n = dilated_layers(rate)
    self.kernel = param(
      nnx.initializers.normal(0.02),
      rngs,
      (n, 2, d_model, d_model),
      ("conv_layers", "window", "embed", "embed_out"),
      param_dtype,
      rows=3,
    )
    self.bias = param(
      nnx.initializers.zeros, None, (n, d_model), ("conv_layers", "norm"), param_dtype
    )

  @classmethod
  def flops_per_slot(cls, rate: int, d_model: int) -> float:
    """Each layer applies its two d -> d taps at every slot (the taps that
    read the zeros before a group's first slot are multiplied too)."""
    return dilated_layers(rate) * 2 * 2 * d_model * d_model

  def __call__(
    self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    c = self.rate
    h = self.groups(jnp.where(mask[..., None], slots, 0))  # [B, N/c, c, d]
    kernel, bias = self.kernel[...].astype(slots.dtype), self.bias[...].astype(slots.dtype)
    for i in range(kernel.shape[0]):
      # h[t - 2**i], 0 before the group
      shifted = jnp.pad(h, ((0, 0), (0, 0), (2**i, 0), (0, 0)))[:, :, :c]
      h = h + jax.nn.gelu(dense(shifted, kernel[i, 0]) + dense(h, kernel[i, 1]) + bias[i])
    return h[:, :, c - 1], self.groups(mask).any(-1)


@register
class MostUsed(Compression):
  """Keeps the N / c slots that received the most attention while they were
  in memory, on average over the segments that attended them (`usage`, see
  memory.push; after DNC's usage-based freeing), in their original temporal
  order."""

  name = "most_used"
  needs_usage = True

  def __call__(
    self, slots: jax.Array, mask: jax.Array, usage: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    _, idx = jax.lax.top_k(jnp.where(mask, usage, -jnp.inf), slots.shape[1] // self.rate)
    idx = jnp.sort(idx, axis=-1)  # [B, N/c]
    out_mask = jnp.take_along_axis(mask, idx, axis=1)
    out = jnp.take_along_axis(slots, idx[..., None], axis=1)
    return jnp.where(out_mask[..., None], out, 0), out_mask


class Compressor(nnx.Module):
  """One layer's f_c (model.compression), the auto-encoder's decoder g when
  that loss trains it, and the step that compresses an eviction into the
  compressed memory. The model stores it as `compressor` in every layer, so
  that optimisers and tests can find its parameters."""

  def __init__(
    self,
    kind: str,
    rate: int,
    d_model: int,
    *,
    reconstruction_loss: str,
    rngs: nnx.Rngs,
    param_dtype: jax.typing.DTypeLike = jnp.float32,
  ) -> None:
    self.fn = resolve(kind)(rate, d_model, rngs=rngs, param_dtype=param_dtype)
    self.kind, self.rate = kind, rate
    # A parameter-free f_c (pooling, most-used) has nothing for a loss to train.
    self.loss = reconstruction_loss if nnx.state(self.fn, nnx.Param) else "none"
    if self.loss == "autoencoding":
      # g: a transposed convolution (kernel = stride = c) back to c slots.
      self.decoder_kernel = param(
        nnx.initializers.lecun_normal(),
        rngs,
        (d_model, rate * d_model),
        ("embed", "embed_out"),
        param_dtype,
      )
      self.decoder_bias = param(
        nnx.initializers.zeros, None, (rate * d_model,), ("norm",), param_dtype
      )

  def __call__(
    self,
    layer_memory: memory_lib.Memory,
    ev: memory_lib.Eviction,
    queries: jax.Array,
    attention: RelativeAttention,
    *,
    with_loss: bool = True,
    keep_gradient: bool = False,
  ) -> tuple[memory_lib.Memory, jax.Array]:
    """Compresses the eviction `ev` into the compressed memory.

    Returns the memory and the reconstruction loss (docs/PAPER.md
    §Attention-reconstruction loss): the layer's content attention from its
    `queries` [B, T, H, D] over the evicted slots' keys and values, against the
    same over the compressed slots' keys and values through the layer's frozen
    weights. Every input of the loss is stop-gradient (the eviction too), so
    this loss trains only f_c. The loss is 0, and not computed, without
    `with_loss` (evaluation, generation) or when f_c has no parameters.

    The compressed slots enter the memory stop-gradient (the paper's), or,
    with `keep_gradient` (model.memory_gradient), with their gradient: the
    loss of later segments then reaches f_c, and through `ev` whatever the
    caller left differentiable in it.
    """
    comp, comp_mask = self._compress(ev)
    comp = comp.astype(ev.slots.dtype)
    new_memory = memory_lib.push_compressed(
      layer_memory,
      comp if keep_gradient else jax.lax.stop_gradient(comp),
      comp_mask,
      attention.compressed_keys_values,
    )
    if not with_loss or self.loss == "none":
      return new_memory, jnp.zeros((), jnp.float32)
    if keep_gradient:  # the loss's own f_c of the stop-gradient eviction: it trains f_c only
      ev = jax.lax.stop_gradient(ev)
      comp = self._compress(ev)[0].astype(ev.slots.dtype)
    if self.loss == "attention":
      q = jax.lax.stop_gradient(queries)
      target = attention.content_attention(q, ev.k, ev.v, ev.mask)
      k_new, v_new = attention.compressed_keys_values(comp, frozen=True)
      approx = attention.content_attention(q, k_new, v_new, comp_mask)
      return new_memory, losses.attention_reconstruction_loss(target, approx, ev.mask)
    return new_memory, losses.autoencoding_loss(self.decode, ev.slots, ev.mask, comp)

  def _compress(self, ev: memory_lib.Eviction) -> tuple[jax.Array, jax.Array]:
    """f_c of the eviction, held to the contract at trace time (shapes and
    dtypes are known then): ([B, N/c, d] floating slots, [B, N/c] bool
    mask). A compression defined outside this package that breaks it, or
    raises, is one ConfigError naming it; a built-in one's error is a bug
    and keeps its traceback."""
    b, n, d = ev.slots.shape
    want = f"([{b}, {n // self.rate}, {d}] floating slots, [{b}, {n // self.rate}] bool mask)"
    where = f"model.compression={self.kind!r} ({type(self.fn).__module__}.{type(self.fn).__name__})"
    plugin = not type(self.fn).__module__.startswith("compressive.")
    try:
      out = self.fn(ev.slots, ev.mask, ev.usage)
    except Exception as e:
      if not plugin:
        raise
      raise ConfigError(
        f"{where} raised {type(e).__name__} on [{b}, {n}, {d}] slots: "
        f"{' '.join(str(e).split())[:300]}"
      ) from e
    if not (
      isinstance(out, tuple)
      and len(out) == 2
      and all(hasattr(x, "shape") and hasattr(x, "dtype") for x in out)
    ):
      got = type(out).__name__ + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
      raise ConfigError(f"{where} returned a {got}; a compression returns a tuple {want}")
    comp, mask = out
    if (
      tuple(comp.shape) != (b, n // self.rate, d)
      or tuple(mask.shape) != (b, n // self.rate)
      or not jnp.issubdtype(comp.dtype, jnp.floating)
      or mask.dtype != jnp.bool_
    ):
      raise ConfigError(
        f"{where} returned ({comp.dtype}{list(comp.shape)}, {mask.dtype}{list(mask.shape)}) "
        f"for [{b}, {n}, {d}] slots at rate {self.rate}; a compression returns {want}"
      )
    return comp, mask

  def decode(self, compressed: jax.Array) -> jax.Array:
    """g: [B, N / c, d] -> [B, N, d] (auto-encoding loss only)."""
    b, g, d = compressed.shape
    dtype = compressed.dtype
    y = dense(compressed, self.decoder_kernel[...].astype(dtype)) + self.decoder_bias[...].astype(
      dtype
    )
    return y.reshape(b, g * self.rate, d)
