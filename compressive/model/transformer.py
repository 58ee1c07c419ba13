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

One `Block` (compressive/model/block.py, with `Aux`, what a call reports)
serves training, streaming evaluation (the memory then carries its slots'
keys and values, `cache_keys_values`) and one-token decoding (`position=`):
docs/DESIGN.md §One layer path.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from compressive.model import memory as memory_lib
from compressive.model.attention import sinusoids
from compressive.model.block import Aux, Block
from compressive.model.config import ModelConfig, require
from compressive.model.layers import LayerNorm, dense, param
from compressive.model.memory import KeysValues, Memory


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
