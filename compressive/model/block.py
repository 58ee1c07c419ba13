"""One layer of the Compressive Transformer: `Block`, and `Aux`, what a
call reports besides its output and memory.

Per call (docs/PAPER.md §Model, Alg. 1): attend over [cmem; mem; segment],
then the residuals and the feed-forward; a whole segment is then pushed into
the layer's memory, and the slots that fall out are compressed into cmem.
One `Block` serves training, streaming evaluation (the memory then carries
its slots' keys and values) and one-token decoding (`position=`):
docs/DESIGN.md §One layer path. compressive/model/transformer.py runs the
layers in order, between the embedding and the output head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Self

from flax import nnx
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from compressive.errors import ConfigError, UserError
from compressive.model import memory as memory_lib
from compressive.model.attention import RelativeAttention, sinusoids
from compressive.model.compression import Compressor
from compressive.model.compression import resolve as resolve_compression
from compressive.model.config import ModelConfig
from compressive.model.layers import FeedForward, LayerNorm
from compressive.model.memory import Memory

# Where attention goes, in key order: Aux.attention_mass and its scalar names.
BANKS = ("compressed_memory", "memory", "segment")


@flax.struct.dataclass
class Aux:
  """What a call reports besides logits and memory.

  At model level `reconstruction_loss` is summed over layers (0 if nothing was
  evicted, in `model.eval()` mode, or for a parameter-free compression) and
  `attention_mass` [3] (by BANKS) averaged over layers, heads, queries and
  rows; it is NaN where rope attention ran fused (no weights).
  `attention_by_key` [L, B, K] (with `collect_attention`) is each layer's
  attention on every key of [cmem; mem; segment], averaged over heads and
  queries (docs/PAPER.md §Analyses); `attention_weights` [L, B, H, T, K] (with
  `attention_weights`) every head's and query's weights themselves.
  """

  reconstruction_loss: jax.Array
  attention_mass: jax.Array
  attention_by_key: Optional[jax.Array] = None
  attention_weights: Optional[jax.Array] = None

  if TYPE_CHECKING:  # flax.struct.dataclass adds it; its stub does not declare it

    def replace(self, **updates: Any) -> Self: ...

  def scalars(self) -> dict[str, jax.Array]:
    """The loggable scalars: reconstruction_loss, attention_mass/<bank>."""
    out = {"reconstruction_loss": self.reconstruction_loss}
    out.update({f"attention_mass/{b}": self.attention_mass[i] for i, b in enumerate(BANKS)})
    return out


def _compressor(cfg: ModelConfig, rngs: nnx.Rngs, param_dtype: jax.typing.DTypeLike) -> Compressor:
  """The layer's Compressor, its compression's constructor held to the
  contract like its __call__: one defined outside the package that raises
  is one ConfigError naming it; a built-in one's error is a bug and keeps
  its traceback."""
  cls = resolve_compression(cfg.compression)
  try:
    return Compressor(
      cfg.compression,
      cfg.compression_rate,
      cfg.d_model,
      reconstruction_loss=cfg.reconstruction_loss,
      rngs=rngs,
      param_dtype=param_dtype,
    )
  except Exception as e:
    if cls.__module__.startswith("compressive.") or isinstance(e, UserError):
      raise
    raise ConfigError(
      f"model.compression={cfg.compression!r} ({cls.__module__}.{cls.__name__}): "
      f"its __init__({cfg.compression_rate}, {cfg.d_model}) raised "
      f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    ) from e


class Block(nnx.Module):
  """One layer: attention over its memory, feed-forward, and the memory
  update with its compression.

  model.norm = "pre":  h = x + attn(LN(x));   out = h + ffn(LN(h))
  model.norm = "post": h = LN(x + attn(x));   out = LN(h + ffn(h))   (Alg. 1)

  Either way the memory stores the layer's input x: with "post" that is the
  previous layer's LN output (the embeddings for the first layer).
  """

  def __init__(
    self,
    cfg: ModelConfig,
    *,
    rngs: nnx.Rngs,
    dtype: jax.typing.DTypeLike,
    param_dtype: jax.typing.DTypeLike = jnp.float32,
  ) -> None:
    self.post_norm = cfg.norm == "post"
    self.attention = RelativeAttention(
      cfg.d_model,
      cfg.num_heads,
      dropout_rate=cfg.dropout_rate,
      rngs=rngs,
      positions=cfg.positions,
      dtype=dtype,
      param_dtype=param_dtype,
      chunk_size=cfg.attention_chunk_size,
      implementation=cfg.attention_implementation,
      normalize_inputs=not self.post_norm,
      own_compressed_keys_values=cfg.compressed_keys_values == "own",
    )
    # Post-norm's LN after the attention's residual (pre-norm's is inside
    # the attention); ffn_norm is the feed-forward's in both.
    self.attention_norm = (
      LayerNorm(cfg.d_model, param_dtype=param_dtype) if self.post_norm else None
    )
    self.ffn_norm = LayerNorm(cfg.d_model, param_dtype=param_dtype)
    self.ffn = FeedForward(cfg.d_model, cfg.d_ff, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.dropout = nnx.Dropout(cfg.dropout_rate, deterministic=False)
    self.needs_usage = resolve_compression(cfg.compression).needs_usage
    self.memory_gradient = cfg.memory_gradient
    self.compressor = None  # Transformer-XL: evicted memories are dropped.
    if cfg.compressed_memory_length:
      self.compressor = nnx.data(_compressor(cfg, rngs, param_dtype))

  def _drop(self, x: jax.Array, rng: Optional[jax.Array], index: int) -> jax.Array:
    return x if rng is None else self.dropout(x, rngs=jax.random.fold_in(rng, index))

  def __call__(
    self,
    x: jax.Array,
    mem: Memory,
    *,
    rng: Optional[jax.Array] = None,
    collect_attention: bool = False,
    position: Optional[jax.Array] = None,
    position_keys: Optional[jax.Array] = None,
    training: bool = True,
    attention_weights: bool = False,
  ) -> tuple[jax.Array, Memory, Aux]:
    """x [B, Tq, d] layer inputs; `mem` this layer's memory (no layer axis).

    A whole segment (position None) attends over [cmem; mem; x] and is pushed
    into the memory. Decoding (`position`, the index of x's first token in the
    current segment; the memory must carry its cache) attends over [cmem; mem;
    the segment's tokens so far; x] and only adds x's keys and values to the
    cache: the complete segment is pushed by a whole-segment call.

    `position_keys` [K + T - 1, H, D]: W_r R for distances K-1 .. -(T-1),
    computed once while the weights do not change (`model.position_keys`);
    otherwise computed here for the K keys.

    `training` False (evaluation, generation) skips the reconstruction
    loss, which only training reads.
    """
    att = self.attention
    q = att.query(x)
    k_x, v_x = att.keys_values(x)
    k, v, valid, q_last, mem = memory_lib.attention_keys(
      mem, att.past_keys_values, k_x, v_x, position
    )
    r = self._position_rows(position_keys, k.shape[1], q_last, x.shape[-1])
    # received [B, K]: attention each key received, mean over heads and
    # queries. It feeds the most-used compression's usage and the diagnostics.
    a, received = att(
      q,
      k,
      v,
      valid,
      q_last,
      r,
      dropout_rng=None if rng is None else jax.random.fold_in(rng, 0),
      need_weights=self.needs_usage or collect_attention,
      per_query=attention_weights,
    )
    weights = None
    if attention_weights:  # [B, H, Tq, K]; `received` is their mean over heads and queries
      assert received is not None  # per_query never takes the fused call
      weights, received = received, received.mean(axis=(1, 2))
    out = self._residuals(x, a, rng)
    received, mass = _attention_mass(received, mem, k.shape[:2])
    mem, recon = self._update_memory(mem, x, q, k, v, received, position, training)
    return out, mem, Aux(recon, mass, received if collect_attention else None, weights)

  def _residuals(self, x: jax.Array, a: jax.Array, rng: Optional[jax.Array]) -> jax.Array:
    """The layer's output [B, Tq, d] from its inputs x and the attention's
    output a: the residuals, the feed-forward and the layer norms where
    model.norm puts them (the class docstring), with dropout when `rng`
    is given."""
    if self.post_norm:
      assert self.attention_norm is not None  # built for post-norm
      h = self.attention_norm(x + self._drop(a, rng, 1))
      out = self.ffn_norm(h + self._drop(self.ffn(h), rng, 2))
    else:
      h = x + self._drop(a, rng, 1)
      out = h + self._drop(self.ffn(self.ffn_norm(h)), rng, 2)
    return out

  def _update_memory(
    self,
    mem: Memory,
    x: jax.Array,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    received: jax.Array,
    position: Optional[jax.Array],
    training: bool,
  ) -> tuple[Memory, jax.Array]:
    """(the memory after the call, the reconstruction loss: 0 unless slots
    were compressed with the loss). `x` the layer's inputs, `q` the queries,
    `k` and `v` the keys and values of [cmem; mem; x], `received` [B, K]
    the attention each key received."""
    recon = jnp.zeros((), jnp.float32)
    # A whole segment enters the memory (Alg. 1); decoded tokens are in the
    # cache already, and the complete segment is pushed by a later call.
    if position is None and mem.memory_length:
      # The paper's: everything stored is stop-gradient (truncated BPTT), and
      # so is what the compressor sees: only its loss trains it. With
      # model.memory_gradient, what is stored keeps its gradient
      # ("memories"), or only the compressed slots do ("compressor").
      c_len = mem.compressed_memory_length
      keep = self.memory_gradient == "memories"
      mem, ev = memory_lib.push(
        mem,
        x if keep else jax.lax.stop_gradient(x),
        received[:, c_len:],
        k[:, c_len:],
        v[:, c_len:],
      )
      if c_len:  # init_memory refuses a compressed memory for a model without compressor
        assert self.compressor is not None
        mem, recon = self.compressor(
          mem,
          ev if keep else jax.lax.stop_gradient(ev),
          q,
          self.attention,
          with_loss=training,
          keep_gradient=self.memory_gradient != "none",
        )
    return mem, recon

  def _position_rows(
    self, position_keys: Optional[jax.Array], kk: int, q_last: int | jax.Array, d: int
  ) -> Optional[jax.Array]:
    """W_r R [K, H, D] for distances q_last .. q_last - K + 1: a slice of the
    precomputed `position_keys` (rows for distances K-1 .. -(T-1), so the
    slice starts at K-1-q_last), or computed for the K keys; None in rope
    mode."""
    if position_keys is not None:
      return jax.lax.dynamic_slice_in_dim(position_keys, kk - 1 - q_last, kk, 0)
    return self.attention.position_keys(sinusoids(np.arange(kk - 1, -1, -1), d))


def _attention_mass(
  received: Optional[jax.Array], mem: Memory, shape: tuple[int, ...]
) -> tuple[jax.Array, jax.Array]:
  """(received [B, K], stop-gradient, zeros where fused rope attention made
  no weights; the attention mass [3] on BANKS, NaN without weights)."""
  if received is None:  # fused rope attention: usage is read by most_used only
    return jnp.zeros(shape, jnp.float32), jnp.full((len(BANKS),), jnp.nan, jnp.float32)
  received = jax.lax.stop_gradient(received)
  c_len, m_len = mem.compressed_memory_length, mem.memory_length
  mass = jnp.stack(
    [
      received[:, :c_len].sum(-1).mean(),
      received[:, c_len : c_len + m_len].sum(-1).mean(),
      received[:, c_len + m_len :].sum(-1).mean(),
    ]
  )
  return received, mass
