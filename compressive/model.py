"""The Compressive Transformer language model (Rae et al. 2020), in Flax NNX.

Notation: B rows, T segment tokens, M memory slots, C compressed slots,
S = C + M, K = S + T keys, L layers, d width, V vocabulary.

    logits, new_memory, aux = model(tokens, memory, start_of_sequence)

Per layer (paper Alg. 1): attend over [cmem; mem; segment]; push the
segment's layer inputs into mem; compress the T oldest slots that fall out
(f_c, rate c) into T / c slots pushed into cmem, whose oldest fall off. The
compression network learns only from the reconstruction loss (§3.2); memories
are stop-gradient between segments (truncated BPTT over one segment).
"""

from __future__ import annotations

from typing import Any, Optional

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp

from compressive import losses
from compressive import memory as memory_lib
from compressive.attention import LayerNorm, RelativeAttention, dense, sinusoid_positions
from compressive.compression import Compressor
from compressive.config_lib import ConfigError, ModelConfig
from compressive.memory import Memory

# Where attention goes, in key order: the aux["attention_mass/<bank>"] names.
BANKS = ("compressed_memory", "memory", "segment")


@flax.struct.dataclass
class KeysValues:
  """Keys and values of every layer's [cmem; mem] slots: k, v [L, B, S, H, D]."""

  k: jax.Array
  v: jax.Array


class FeedForward(nnx.Module):

  def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs, dtype, param_dtype):
    init = nnx.initializers.lecun_normal()
    self.w1 = nnx.Param(init(rngs.params(), (d_model, d_ff), param_dtype))
    self.b1 = nnx.Param(jnp.zeros((d_ff,), param_dtype))
    self.w2 = nnx.Param(init(rngs.params(), (d_ff, d_model), param_dtype))
    self.b2 = nnx.Param(jnp.zeros((d_model,), param_dtype))
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    c = lambda p: p[...].astype(self.dtype)
    h = jax.nn.gelu(dense(x, c(self.w1)) + c(self.b1))
    return dense(h, c(self.w2)) + c(self.b2)


class Block(nnx.Module):
  """One pre-norm layer with its memory update and compressor."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype=jnp.float32):
    self.attention = RelativeAttention(
        cfg.d_model, cfg.num_heads, dropout_rate=cfg.dropout_rate, rngs=rngs,
        positions=cfg.positions, dtype=dtype, param_dtype=param_dtype)
    self.ffn_norm = LayerNorm(cfg.d_model, param_dtype=param_dtype)
    self.ffn = FeedForward(cfg.d_model, cfg.d_ff, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.dropout = nnx.Dropout(cfg.dropout_rate, deterministic=False)
    self.reconstruction_loss = cfg.reconstruction_loss
    self.needs_usage = cfg.compression == "most_used"
    if cfg.compressed_memory_length:
      self.compressor = Compressor(
          cfg.compression, cfg.compression_rate, cfg.d_model,
          autoencoder=cfg.reconstruction_loss == "autoencoding",
          rngs=rngs, param_dtype=param_dtype)
    else:
      self.compressor = None  # Transformer-XL: evicted memories are dropped.

  def _drop(self, x, rng, index):
    if rng is None:
      return x
    return self.dropout(x, rngs=jax.random.fold_in(rng, index))

  def __call__(
      self, x: jax.Array, mem: Memory, positions: Optional[jax.Array], rng: Optional[jax.Array],
      collect_attention: bool = False, past_kv: Optional[tuple[jax.Array, jax.Array]] = None,
  ) -> tuple[jax.Array, Memory, dict[str, jax.Array]]:
    """x [B, T, d] layer input; mem is this layer's memory (no layer axis).

    With `past_kv`, the cached keys and values [B, S, H, D] of [cmem; mem],
    they are not recomputed, and stats["kv"] holds those of the new memory.

    The attention weights are computed only where something reads them: the
    most-used compression's usage and `collect_attention`. Otherwise rope
    attention runs fused (`jax.nn.dot_product_attention`), and the
    attention_mass/* diagnostics are NaN; relative attention always has them.
    """
    c_len, m_len = mem.compressed_memory_length, mem.memory_length
    past = jnp.concatenate([mem.cmem, mem.mem], axis=1).astype(x.dtype)  # [B, S, d]
    past_valid = jnp.concatenate([mem.cmem_mask, mem.mem_mask], axis=1)
    attn_rng = None if rng is None else jax.random.fold_in(rng, 0)
    a, probs, (q, k, v) = self.attention(
        x, past, past_valid, positions, dropout_rng=attn_rng, past_kv=past_kv,
        need_weights=self.needs_usage or collect_attention)
    h = x + self._drop(a, rng, 1)
    out = h + self._drop(self.ffn(self.ffn_norm(h)), rng, 2)

    # Attention each key received, mean over heads and queries: [B, K]. It
    # feeds the most-used compression's usage and the diagnostics (§5.5).
    if probs is not None:
      received = jax.lax.stop_gradient(probs.mean(axis=(1, 2)))
      mass = [received[:, :c_len].sum(-1).mean(),
              received[:, c_len:c_len + m_len].sum(-1).mean(),
              received[:, c_len + m_len:].sum(-1).mean()]
    else:  # fused rope attention: no weights; usage is read by most_used only
      received = jnp.zeros(past_valid.shape[:1] + (k.shape[1],), jnp.float32)
      mass = [jnp.full((), jnp.nan, jnp.float32)] * 3
    stats = {f"attention_mass/{name}": value for name, value in
             zip(BANKS, mass)}
    if collect_attention:
      stats["attention_by_key"] = received

    # Memory update (Alg. 1). Everything stored is stop-gradient (truncated
    # BPTT), and so is what the compressor sees: only its loss trains it.
    recon = jnp.zeros((), jnp.float32)
    if m_len:
      new_mem, ev = memory_lib.push(mem, jax.lax.stop_gradient(x), received[:, c_len:])
      ev = jax.lax.stop_gradient(ev)
      if c_len:
        if self.compressor is None:
          raise ConfigError(
              "the memory has a compressed memory but the model was built with "
              "model.compressed_memory_length=0 (no compressor)")
        comp, comp_mask = self.compressor(ev.slots, ev.mask, ev.usage)
        new_mem = memory_lib.push_compressed(new_mem, jax.lax.stop_gradient(comp), comp_mask)
        if self.reconstruction_loss == "attention":
          # §3.2: stop-gradient on the queries h, the old memories and the
          # layer's weights, so that only f_c learns from this loss. The
          # queries and the evicted slots' keys and values are the ones this
          # layer just computed (evicted = keys C .. C+T-1 of [cmem; mem; x]).
          t = x.shape[1]
          q0, k_old, v_old = jax.lax.stop_gradient(
              (q, k[:, c_len:c_len + t], v[:, c_len:c_len + t]))
          target = self.attention.content_attention(q0, k_old, v_old, ev.mask)
          k_new, v_new = self.attention.frozen_keys_values(comp)
          approx = self.attention.content_attention(q0, k_new, v_new, comp_mask)
          recon = losses.attention_reconstruction_loss(target, approx, ev.mask)
        elif self.reconstruction_loss == "autoencoding":
          recon = losses.autoencoding_loss(self.compressor.decode, ev.slots, ev.mask, comp)
    else:
      new_mem = mem  # a segment-local Transformer keeps nothing
    stats["reconstruction_loss"] = recon
    if past_kv is not None:
      # The cache follows the memory: mem keeps the newest M of [mem; x]
      # (keys C + T ..), cmem the newest C of [cmem; compressed].
      t = x.shape[1]
      new_k, new_v = k[:, c_len + t:], v[:, c_len + t:]
      if c_len:
        k_c, v_c = self.attention.keys_values(jax.lax.stop_gradient(comp).astype(x.dtype))
        new_k = jnp.concatenate([jnp.concatenate([k[:, :c_len], k_c], 1)[:, -c_len:], new_k], 1)
        new_v = jnp.concatenate([jnp.concatenate([v[:, :c_len], v_c], 1)[:, -c_len:], new_v], 1)
      stats["kv"] = jax.lax.stop_gradient((new_k, new_v))
    return out, new_mem, stats


class CompressiveTransformer(nnx.Module):
  """Compressive Transformer LM. `compressed_memory_length=0` is
  Transformer-XL; `memory_length=compressed_memory_length=0` a segment-local
  Transformer."""

  def __init__(self, model_config: Any, *, rngs: nnx.Rngs):
    cfg = ModelConfig.from_config(model_config)
    self.config = cfg
    dtype = jnp.dtype(cfg.dtype)
    self.dtype = dtype
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, rngs=rngs,
                           embedding_init=nnx.initializers.normal(1.0))
    self.embed_dropout = nnx.Dropout(cfg.dropout_rate, deterministic=False)
    self.blocks = nnx.List([Block(cfg, rngs=rngs, dtype=dtype) for _ in range(cfg.num_layers)])
    self.final_norm = LayerNorm(cfg.d_model)
    self.head = nnx.Param(nnx.initializers.lecun_normal()(
        rngs.params(), (cfg.d_model, cfg.vocab_size), jnp.float32))

  def init_memory(self, batch_size: int, **sizes) -> Memory:
    """An empty memory for this model (sizes may be overridden for eval)."""
    return memory_lib.init_memory(self.config, batch_size, self.dtype, **sizes)

  def memory_keys_values(self, memory: Memory) -> KeysValues:
    """Every layer's keys and values of its [cmem; mem] slots, to pass as
    `kv_cache` while the weights do not change (evaluation, generation)."""
    ks, vs = [], []
    for i, block in enumerate(self.blocks):
      layer = memory.layer(i)
      past = jnp.concatenate([layer.cmem, layer.mem], axis=1).astype(self.dtype)
      k, v = block.attention.keys_values(past)
      ks.append(k)
      vs.append(v)
    return KeysValues(k=jnp.stack(ks), v=jnp.stack(vs))

  def __call__(
      self,
      tokens: jax.Array,
      memory: Memory,
      start_of_sequence: Optional[jax.Array] = None,
      *,
      dropout_rng: Optional[jax.Array] = None,
      collect_attention: bool = False,
      kv_cache: Optional[KeysValues] = None,
  ) -> tuple[jax.Array, Memory, dict[str, jax.Array]]:
    """Processes one segment.

    Args:
      tokens: int32 [B, T]; T a multiple of the compression rate when the
        memory has a compressed memory.
      memory: the memory before this segment (see `init_memory`).
      start_of_sequence: bool [B]; rows whose memory is reset first.
      dropout_rng: a key enabling dropout (training); None, or `model.eval()`,
        makes the call deterministic.
      collect_attention: also return aux["attention_by_key"] [L, B, K], each
        layer's attention weight on every key of [cmem; mem; segment], averaged
        over heads and queries (the paper's §5.5 analysis).
      kv_cache: the memory's keys and values (`memory_keys_values(memory)`,
        or the previous call's aux["kv_cache"]), so that each slot's are
        computed once rather than every segment. Only valid while the weights
        do not change; aux["kv_cache"] then holds the new memory's.

    Returns:
      logits [B, T, V] (float32), the memory after this segment
      (stop-gradient), and aux: scalars `reconstruction_loss` (summed over
      layers; 0 if nothing was evicted) and `attention_mass/*` (mean over
      layers, heads, queries, rows; NaN where rope attention ran fused, see
      `Block`).
    """
    cfg = self.config
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}")
    b, t = tokens.shape
    if memory.num_layers != cfg.num_layers or memory.batch_size != b:
      raise ValueError(
          f"memory is for {memory.num_layers} layers x {memory.batch_size} rows; "
          f"the model has {cfg.num_layers} layers and tokens have {b} rows")
    if memory.compressed_memory_length and t % cfg.compression_rate:
      raise ValueError(
          f"segment of {t} tokens is not a multiple of compression_rate={cfg.compression_rate}")
    if memory.mem.shape[-1] != cfg.d_model:
      raise ValueError(f"memory width {memory.mem.shape[-1]} != model.d_model={cfg.d_model}")
    if self.embed_dropout.deterministic or cfg.dropout_rate == 0.0:
      dropout_rng = None

    if start_of_sequence is not None:
      memory = memory_lib.reset_rows(memory, start_of_sequence)
    memory = jax.lax.stop_gradient(memory)

    x = self.embed(tokens).astype(self.dtype)  # [B, T, d]
    if dropout_rng is not None:
      x = self.embed_dropout(x, rngs=jax.random.fold_in(dropout_rng, cfg.num_layers))
    k = memory.compressed_memory_length + memory.memory_length + t
    positions = None  # rope: the attention rotates by index
    if cfg.positions == "relative":
      positions = sinusoid_positions(k, cfg.d_model)  # [K, d]
    new_layers, stats = [], []
    for i, block in enumerate(self.blocks):
      rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)
      past_kv = None if kv_cache is None else (kv_cache.k[i], kv_cache.v[i])
      x, layer_mem, layer_stats = block(x, memory.layer(i), positions, rng, collect_attention,
                                        past_kv)
      new_layers.append(layer_mem)
      stats.append(layer_stats)
    x = self.final_norm(x)
    logits = dense(x, self.head[...].astype(self.dtype)).astype(jnp.float32)

    aux = {name: jnp.mean(jnp.stack([s[name] for s in stats])) for name in stats[0]
           if name not in ("attention_by_key", "kv")}
    if kv_cache is not None:
      aux["kv_cache"] = KeysValues(k=jnp.stack([s["kv"][0] for s in stats]),
                                   v=jnp.stack([s["kv"][1] for s in stats]))
    if collect_attention:
      aux["attention_by_key"] = jnp.stack([s["attention_by_key"] for s in stats])
    aux["reconstruction_loss"] = jnp.sum(jnp.stack([s["reconstruction_loss"] for s in stats]))
    new_memory = jax.lax.stop_gradient(Memory.stack(new_layers))
    return logits, new_memory, aux


def merge_params(graphdef, state_template, params) -> CompressiveTransformer:
  """The model with `params` (a pure dict, nnx.to_pure_dict's form) filled
  into a copy of `state_template` — how the functional train and eval steps
  rebuild the module inside jit."""
  state = jax.tree.map(lambda x: x, state_template)  # a copy to fill
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)
