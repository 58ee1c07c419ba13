"""The Compressive Transformer language model (Rae et al. 2020), in Flax NNX.

Notation: B rows, T segment tokens, M memory slots, C compressed slots,
S = C + M, K = S + T keys, L layers, d width, V vocabulary, H heads, D head
width.

    logits, new_memory, aux = model(tokens, memory, start_of_sequence)

Per layer (docs/PAPER.md §Model, Alg. 1): attend over [cmem; mem; segment];
push the segment's layer inputs into mem; compress the T oldest slots that
fall out (f_c, rate c) into T / c slots pushed into cmem, whose oldest fall
off. The compression network learns only from the reconstruction loss;
memories are stop-gradient between segments (truncated BPTT over one segment).
`model.memory_gradient` (beyond the paper; docs/DESIGN.md §Task-taught
compression) lets the compressed slots, or every stored slot, keep their
gradient, so that the loss of later segments in the train step's gradient
window reaches the compression network (and the layers that wrote them).

One `Block` serves training, streaming evaluation (the memory then carries
its slots' keys and values, `cache_keys_values`) and one-token decoding
(`position=`): docs/DESIGN.md §One layer path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Self

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
from compressive.model.config import ModelConfig, require
from compressive.model.layers import FeedForward, LayerNorm, dense, param
from compressive.model.memory import KeysValues, Memory

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
    if self.post_norm:
      assert self.attention_norm is not None  # built for post-norm
      h = self.attention_norm(x + self._drop(a, rng, 1))
      out = self.ffn_norm(h + self._drop(self.ffn(h), rng, 2))
    else:
      h = x + self._drop(a, rng, 1)
      out = h + self._drop(self.ffn(self.ffn_norm(h)), rng, 2)
    received, mass = _attention_mass(received, mem, k.shape[:2])
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
          att,
          with_loss=training,
          keep_gradient=self.memory_gradient != "none",
        )
    return out, mem, Aux(recon, mass, received if collect_attention else None, weights)

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


class CompressiveTransformer(nnx.Module):
  """Compressive Transformer LM. `compressed_memory_length=0` is
  Transformer-XL; `memory_length=compressed_memory_length=0` a segment-local
  Transformer."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs) -> None:
    require(cfg, "CompressiveTransformer")
    self.config = cfg
    dtype = jnp.dtype(cfg.dtype)
    self.dtype = dtype
    self.embed = nnx.Embed(
      cfg.vocab_size, cfg.d_model, rngs=rngs, embedding_init=nnx.initializers.normal(1.0)
    )
    self.embed.embedding.set_metadata(out_sharding=("vocab", "embed"), eager_sharding=False)
    self.embed_dropout = nnx.Dropout(cfg.dropout_rate, deterministic=False)
    blocks = [Block(cfg, rngs=rngs, dtype=dtype) for _ in range(cfg.num_layers)]
    # scan_layers: one Block whose every parameter has a leading layer axis
    # (logical axis 'layers'), drawn exactly as the unrolled layers are.
    self.blocks = _stack(blocks) if cfg.scan_layers else nnx.List(blocks)
    # Post-norm layers end in LN already: the paper has no final LN.
    self.final_norm = None if cfg.norm == "post" else LayerNorm(cfg.d_model)
    self.head = param(
      nnx.initializers.lecun_normal(), rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab")
    )

  def init_memory(self, batch_size: int, **sizes: Optional[int]) -> Memory:
    """An empty memory for this model (sizes may be overridden for eval)."""
    return memory_lib.init_memory(self.config, batch_size, self.dtype, **sizes)

  def cache_keys_values(self, memory: Memory, segment_length: Optional[int] = None) -> Memory:
    """`memory` carrying every slot's keys and values (and room for a
    segment's, for decoding; segment_length=0 when only whole segments
    follow, as in evaluation), so that later calls compute each slot's once, when it enters
    the memory, instead of every segment, and keep the cache up to date. Only
    valid while the weights do not change (evaluation, generation)."""
    t = self.config.segment_length if segment_length is None else segment_length
    kv = lambda att, layer: att.past_keys_values(
      layer.cmem.astype(self.dtype), layer.mem.astype(self.dtype)
    )
    _, (k, v) = self._over_layers(
      lambda block, carry, index, layer: (carry, kv(block.attention, layer)),
      None,
      (memory.replace(cache=None),),
    )
    seg = jnp.zeros(k.shape[:2] + (t,) + k.shape[3:], k.dtype)
    return memory.replace(cache=KeysValues(k=k, v=v, seg_k=seg, seg_v=seg))

  def position_keys(self, memory: Memory, segment_length: int) -> Optional[jax.Array]:
    """Every layer's W_r R [L, K + T - 1, H, D] for distances K-1 .. -(T-1)
    (K = S + T), for decoding while the weights do not change; None in rope
    mode. A query at any position of the segment reads a K-row slice."""
    if self.config.positions != "relative":
      return None
    k = memory.compressed_memory_length + memory.memory_length + segment_length
    table = sinusoids(np.arange(k - 1, -segment_length, -1), self.config.d_model)
    return self._over_layers(
      lambda block, carry, index: (carry, block.attention.position_keys(table)), None
    )[1]

  def _layer_states(self) -> tuple[nnx.GraphDef, nnx.State | list[nnx.State]]:
    """(graphdef of one layer, the layers' states: a list, or one state
    whose leaves carry the layer axis when scan_layers)."""
    if self.config.scan_layers:
      return nnx.split(self.blocks)
    assert isinstance(self.blocks, nnx.List)  # unrolled: built as a list of Blocks
    splits = [nnx.split(block) for block in self.blocks]
    return splits[0][0], [state for _, state in splits]

  def _over_layers(
    self,
    fn: Callable[..., tuple[Any, Any]],
    carry: Any,
    per_layer: tuple[Any, ...] = (),
    shared: tuple[Any, ...] = (),
    remat: bool = False,
  ) -> tuple[Any, Any]:
    """Runs the layers in order: carry, out = fn(block, carry, index, *xs,
    *shared) for every layer, xs the layer's slices of the tuple `per_layer`
    (pytrees with a leading layer axis; None is an empty one), `shared` the
    same for every layer. Returns the last carry and the outs stacked on a
    layer axis. Unrolled, or one `lax.scan` over the stacked layer and the
    layer axes (scan_layers). `remat`: each layer's backward pass keeps what
    `model.remat` says."""
    cfg = self.config
    graphdef, states = self._layer_states()

    def layer(carry: Any, state: nnx.State, index: int | jax.Array, *xs: Any) -> tuple[Any, Any]:
      return fn(nnx.merge(graphdef, state), carry, index, *xs)

    if remat and cfg.remat != "none":
      policy = (
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable if cfg.remat == "matmuls" else None
      )
      layer = jax.checkpoint(layer, policy=policy, prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers and carry is None:  # nothing threads the layers: all at once
      run = lambda state, index, *xs: layer(None, state, index, *xs, *shared)[1]
      return None, jax.vmap(run)(states, jnp.arange(cfg.num_layers), *per_layer)
    if cfg.scan_layers:
      return jax.lax.scan(
        lambda carry, xs: layer(carry, *xs, *shared),
        carry,
        (states, jnp.arange(cfg.num_layers)) + tuple(per_layer),
      )
    outs = []
    for i, state in enumerate(states):
      carry, out = layer(
        carry, state, i, *jax.tree.map(lambda a, i=i: a[i], tuple(per_layer)), *shared
      )
      outs.append(out)
    return carry, jax.tree.map(lambda *a: jnp.stack(a), *outs)

  def __call__(
    self,
    tokens: jax.Array,
    memory: Memory,
    start_of_sequence: Optional[jax.Array] = None,
    *,
    dropout_rng: Optional[jax.Array] = None,
    collect_attention: bool = False,
    position: Optional[jax.Array] = None,
    position_keys: Optional[jax.Array] = None,
    attention_weights: bool = False,
  ) -> tuple[jax.Array, Memory, Aux]:
    """Processes one segment, or (with `position`) decodes a few tokens.

    Args:
      tokens: int32 [B, T]; T a multiple of the compression rate when the
        memory has a compressed memory.
      memory: the memory before this segment (see `init_memory`), carrying
        its keys and values if `cache_keys_values` made it.
      start_of_sequence: bool [B]; rows whose memory is reset first.
      dropout_rng: a key enabling dropout (training); None, or `model.eval()`,
        makes the call deterministic. `model.eval()` also skips the
        reconstruction loss (aux.reconstruction_loss is then 0): only
        training reads it.
      collect_attention: fill aux.attention_by_key.
      attention_weights: fill aux.attention_weights (every head's and
        query's weights: the probe analysis reads where answers look).
      position: decoding: the index in the current segment of tokens' first
        token (the memory must carry its cache). The memory is not pushed;
        a whole-segment call does that when the segment is complete.
      position_keys: `self.position_keys(memory, T)`, for decoding.

    Returns:
      logits [B, T, V] (float32), the memory after this segment
      (stop-gradient, unless model.memory_gradient lets parts of it keep
      their gradient), and `Aux`.
    """
    cfg = self.config
    tokens = jnp.asarray(tokens)
    self._check_call(tokens, memory, position)
    training = not self.embed_dropout.deterministic  # model.eval(): no training-only work
    if not training or cfg.dropout_rate == 0.0:
      dropout_rng = None

    if start_of_sequence is not None:
      memory = memory_lib.reset_rows(memory, start_of_sequence)
    if cfg.memory_gradient == "none":
      memory = jax.lax.stop_gradient(memory)
    x = self.embed(tokens).astype(self.dtype)  # [B, T, d]
    if dropout_rng is not None:
      x = self.embed_dropout(x, rngs=jax.random.fold_in(dropout_rng, cfg.num_layers))
    x, new_memory, aux = self._layers(
      x,
      memory,
      dropout_rng,
      collect_attention,
      position,
      position_keys,
      training,
      attention_weights,
    )
    if self.final_norm is not None:
      x = self.final_norm(x)
    logits = dense(x, self.head[...].astype(self.dtype)).astype(jnp.float32)
    aux = aux.replace(
      reconstruction_loss=aux.reconstruction_loss.sum(), attention_mass=aux.attention_mass.mean(0)
    )
    if cfg.memory_gradient == "none":
      new_memory = jax.lax.stop_gradient(new_memory)
    return logits, new_memory, aux

  def _check_call(self, tokens: jax.Array, memory: Memory, position: Optional[jax.Array]) -> None:
    """ValueError when the tokens and the memory do not fit this model."""
    cfg = self.config
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}")
    b, t = tokens.shape
    if memory.num_layers != cfg.num_layers or memory.batch_size != b:
      raise ValueError(
        f"memory is for {memory.num_layers} layers x {memory.batch_size} rows; "
        f"the model has {cfg.num_layers} layers and tokens have {b} rows"
      )
    if position is None and memory.compressed_memory_length and t % cfg.compression_rate:
      raise ValueError(
        f"segment of {t} tokens is not a multiple of compression_rate={cfg.compression_rate}"
      )
    if position is not None and memory.cache is None:
      raise ValueError("decoding (position=...) needs a memory made by cache_keys_values")
    if memory.mem.shape[-1] != cfg.d_model:
      raise ValueError(f"memory width {memory.mem.shape[-1]} != model.d_model={cfg.d_model}")

  def _layers(
    self,
    x: jax.Array,
    memory: Memory,
    dropout_rng: Optional[jax.Array],
    collect_attention: bool,
    position: Optional[jax.Array],
    position_keys: Optional[jax.Array],
    training: bool,
    attention_weights: bool = False,
  ) -> tuple[jax.Array, Memory, Aux]:
    """Runs the blocks in order: (output, memory, aux), the last two with a
    leading layer axis."""

    def layer(
      block: Block,
      x: jax.Array,
      index: int | jax.Array,
      mem: Memory,
      pk: Optional[jax.Array],
      rng: Optional[jax.Array],
      pos: Optional[jax.Array],
    ) -> tuple[jax.Array, tuple[Memory, Aux]]:
      rng = None if rng is None else jax.random.fold_in(rng, index)
      x, mem, aux = block(
        x,
        mem,
        rng=rng,
        collect_attention=collect_attention,
        position=pos,
        position_keys=pk,
        training=training,
        attention_weights=attention_weights,
      )
      return x, (mem, aux)

    x, (new_memory, aux) = self._over_layers(
      layer, x, (memory, position_keys), (dropout_rng, position), remat=True
    )
    return x, new_memory, aux


def _stack(blocks: list[Block]) -> Block:
  """The layers as one Block whose parameters are stacked along a leading
  layer axis, declared as logical axis 'layers'."""
  graphdef, state = nnx.split(blocks[0])
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *[nnx.split(b)[1] for b in blocks])
  for _, var in nnx.to_flat_state(stacked):
    var.set_metadata(out_sharding=("layers",) + tuple(var.get_metadata()["out_sharding"]))
  return nnx.merge(graphdef, stacked)


def merge_params(
  graphdef: nnx.GraphDef[CompressiveTransformer], state_template: nnx.State, params: dict[str, Any]
) -> CompressiveTransformer:
  """The model with `params` (a pure dict, nnx.to_pure_dict's form) filled
  into a copy of `state_template` — how the functional train and eval steps
  rebuild the module inside jit."""
  state = jax.tree.map(lambda x: x, state_template)  # a copy to fill
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)
