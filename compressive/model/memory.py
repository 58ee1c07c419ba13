"""The memory: per-layer FIFO memory and compressed memory (docs/PAPER.md
§Model, Alg. 1), with the keys and values of its slots when they are cached.

Notation: L layers, B batch rows, M memory slots (n_m), C compressed-memory
slots (n_cm), T segment length, H heads, D head width, d model width.

The memory is a plain pytree value threaded through the model, never hidden
module state. At model level every array carries a leading layer axis and then
the batch axis (`mem [L, B, M, d]`); a layer sees the same class with the layer
axis sliced off (`mem [B, M, d]`). Slots are ordered oldest first. Empty slots
are marked invalid in the masks and are never attended, so a row can be reset
mid-batch without zero-filling tricks. docs/DESIGN.md §The memory's life cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Self

import flax.struct
import jax
import jax.numpy as jnp

from compressive.model import config as config_lib


@flax.struct.dataclass
class KeysValues:
  """Cached keys and values: every slot's are computed once, when it enters
  the memory, instead of every segment. Valid only while the weights do not
  change (evaluation, generation). The slots' keys are one array in key
  order, as attention reads them: concatenating the two banks' in every
  layer and segment made streaming evaluation ~7% slower."""

  k: jax.Array  # [L, B, C + M, H, D] of [cmem; mem]
  v: jax.Array
  seg_k: jax.Array  # [L, B, T, H, D] the current segment's tokens so far (decoding)
  seg_v: jax.Array

  if TYPE_CHECKING:  # flax.struct.dataclass adds it; its stub does not declare it

    def replace(self, **updates: Any) -> Self: ...


@flax.struct.dataclass
class Memory:
  """Memory and compressed memory of past layer inputs.

  Sizes are read from the shapes, so evaluation may build a larger memory than
  training did (docs/PAPER.md: enwik8 evaluates with n_cm = 3072).
  """

  mem: jax.Array  # [L, B, M, d] past layer inputs, oldest first
  mem_mask: jax.Array  # [L, B, M] bool: the slot holds a real token
  cmem: jax.Array  # [L, B, C, d] compressed past, oldest first
  cmem_mask: jax.Array  # [L, B, C] bool
  # [L, B, M] float32: attention each memory slot received while in memory,
  # summed over the segments that attended it; `visits` counts those.
  usage: jax.Array
  visits: jax.Array  # [L, B, M] float32
  cache: Optional[KeysValues] = None

  if TYPE_CHECKING:  # flax.struct.dataclass adds it; its stub does not declare it

    def replace(self, **updates: Any) -> Self: ...

  @property
  def memory_length(self) -> int:
    return self.mem.shape[-2]

  @property
  def compressed_memory_length(self) -> int:
    return self.cmem.shape[-2]

  @property
  def num_layers(self) -> int:
    return self.mem.shape[0]

  @property
  def batch_size(self) -> int:
    return self.mem.shape[1]

  def layer(self, index: int) -> "Memory":
    """The memory of one layer (the same class, layer axis removed)."""
    return jax.tree.map(lambda a: a[index], self)

  @staticmethod
  def stack(layers: list["Memory"]) -> "Memory":
    """Inverse of `layer`: stacks per-layer memories along a new layer axis."""
    return jax.tree.map(lambda *a: jnp.stack(a), *layers)


def init_memory(
  cfg: config_lib.ModelConfig,
  batch_size: int,
  dtype: jax.typing.DTypeLike = jnp.float32,
  *,
  memory_length: Optional[int] = None,
  compressed_memory_length: Optional[int] = None,
) -> Memory:
  """A memory whose slots are all empty (masked), for the model of `cfg`;
  the sizes override the model's (evaluation may use larger memories)."""
  config_lib.require(cfg, "init_memory")
  m = cfg.memory_length if memory_length is None else memory_length
  cm = (
    cfg.compressed_memory_length if compressed_memory_length is None else compressed_memory_length
  )
  config_lib.check_memory_sizes(cfg, m, cm, batch_size)
  layers, d = cfg.num_layers, cfg.d_model
  return Memory(
    mem=jnp.zeros((layers, batch_size, m, d), dtype),
    mem_mask=jnp.zeros((layers, batch_size, m), bool),
    cmem=jnp.zeros((layers, batch_size, cm, d), dtype),
    cmem_mask=jnp.zeros((layers, batch_size, cm), bool),
    usage=jnp.zeros((layers, batch_size, m), jnp.float32),
    visits=jnp.zeros((layers, batch_size, m), jnp.float32),
  )


def reset_rows(memory: Memory, start_of_sequence: jax.Array) -> Memory:
  """Empties the rows that start a new document; other rows are untouched.
  A reset row's cached keys stay, unread: its masks say its slots are empty
  (rewriting the cache every segment would cost evaluation ~7%).

  Args:
    memory: model-level memory (layer axis, then batch axis, on every field).
    start_of_sequence: bool [B].
  """
  sos = jnp.asarray(start_of_sequence, bool)

  def reset(a: jax.Array) -> jax.Array:
    flag = sos.reshape((1, -1) + (1,) * (a.ndim - 2))
    return jnp.where(flag, jnp.zeros_like(a), a)

  return jax.tree.map(reset, memory.replace(cache=None)).replace(cache=memory.cache)


def attention_keys(
  layer_memory: Memory,
  keys_values: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
  k_x: jax.Array,
  v_x: jax.Array,
  position: int | jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, int | jax.Array, Memory]:
  """The keys of [compressed memory; memory; segment so far] a layer attends.

  Args:
    layer_memory: one layer's memory (no layer axis); with `position` it must
      carry its cache.
    keys_values: (compressed slots [B, C, d], slots [B, M, d]) -> the keys
      and values of both [B, C + M, H, D] (the layer's projections,
      `RelativeAttention.past_keys_values`), when nothing caches them.
    k_x, v_x: [B, Tq, H, D] keys and values of the layer's inputs.
    position: None for a whole segment (the inputs are the segment); when
      decoding, the index of the inputs' first token in the current segment,
      whose earlier tokens' keys the cache holds.

  Returns:
    (k, v [B, K, H, D] in x's dtype, valid [B, K] bool, q_last: the last
    query's key index, the memory: when decoding, with the inputs' keys and
    values put into the cache's segment; otherwise `layer_memory`).
  """
  dtype, cache = k_x.dtype, layer_memory.cache
  b, tq = k_x.shape[:2]
  past = layer_memory.compressed_memory_length + layer_memory.memory_length
  q_last: int | jax.Array
  if cache is None:
    k_past, v_past = keys_values(layer_memory.cmem.astype(dtype), layer_memory.mem.astype(dtype))
  else:
    k_past, v_past = cache.k.astype(dtype), cache.v.astype(dtype)
  if position is None:
    k_seg, v_seg, seg_valid, q_last = k_x, v_x, jnp.ones((b, tq), bool), past + tq - 1
  else:
    assert cache is not None  # decoding: the transformer refuses a memory without one
    put = lambda buf, new: jax.lax.dynamic_update_slice_in_dim(
      buf, new.astype(buf.dtype), position, 1
    )
    k_seg, v_seg = put(cache.seg_k, k_x), put(cache.seg_v, v_x)
    seg_valid = jnp.broadcast_to(jnp.arange(k_seg.shape[1]) < position + tq, (b, k_seg.shape[1]))
    q_last = past + position + tq - 1
    layer_memory = layer_memory.replace(cache=cache.replace(seg_k=k_seg, seg_v=v_seg))
  k = jnp.concatenate([k_past, k_seg.astype(dtype)], 1)
  v = jnp.concatenate([v_past, v_seg.astype(dtype)], 1)
  valid = jnp.concatenate([layer_memory.cmem_mask, layer_memory.mem_mask, seg_valid], 1)
  return k, v, valid, q_last, layer_memory


def _fifo(old: jax.Array, new: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Appends `new` [B, N, ...] behind `old` [B, L, ...]: (the newest L, the N
  oldest that fell out)."""
  both = jnp.concatenate([old, new.astype(old.dtype)], axis=1)
  n = new.shape[1]
  return both[:, n:], both[:, :n]


@flax.struct.dataclass
class Eviction:
  """The oldest slots pushed out of one layer's memory by a segment."""

  slots: jax.Array  # [B, T, d] oldest first
  mask: jax.Array  # [B, T] bool
  usage: jax.Array  # [B, T] mean attention received per segment in memory (0: never in memory)
  k: jax.Array  # [B, T, H, D] their keys and values in this segment
  v: jax.Array


def push(
  layer_memory: Memory, inputs: jax.Array, received: jax.Array, k: jax.Array, v: jax.Array
) -> tuple[Memory, Eviction]:
  """Pushes a segment's layer inputs into one layer's memory (FIFO).

  Args:
    layer_memory: one layer's memory (no layer axis).
    inputs: [B, T, d] the segment's inputs to this layer.
    received: [B, M + T] attention each memory slot and segment token received
      in this segment (mean over heads and queries). The memory slots' part
      accumulates into `usage` and counts a visit, for the most-used
      compression; a segment token's does not (a token early in the
      segment is seen by more causal queries than a late one).
    k, v: [B, M + T, H, D] keys and values of [memory; inputs].

  Returns:
    The memory with the newest M of [memory; inputs] kept (its cached keys and
    values too; compressed memory unchanged), and the T oldest slots that fell
    out, with their mean usage per visit. With M = 0 nothing is kept and the
    inputs themselves are evicted.
  """
  b, t, _ = inputs.shape
  m = layer_memory.memory_length
  mem, slots = _fifo(layer_memory.mem, inputs)
  mask, ev_mask = _fifo(layer_memory.mem_mask, jnp.ones((b, t), bool))
  attended = layer_memory.mem_mask.astype(jnp.float32)
  new = jnp.zeros((b, t), jnp.float32)
  usage, ev_usage = _fifo(layer_memory.usage + received[:, :m] * attended, new)
  visits, ev_visits = _fifo(layer_memory.visits + attended, new)
  kept = layer_memory.replace(mem=mem, mem_mask=mask, usage=usage, visits=visits)
  if layer_memory.cache is not None:
    c = layer_memory.compressed_memory_length
    cache = layer_memory.cache
    kept = kept.replace(
      cache=cache.replace(
        k=jnp.concatenate([cache.k[:, :c], k[:, t:]], 1),
        v=jnp.concatenate([cache.v[:, :c], v[:, t:]], 1),
      )
    )
  mean_usage = ev_usage / jnp.maximum(ev_visits, 1.0)
  return kept, Eviction(slots=slots, mask=ev_mask, usage=mean_usage, k=k[:, :t], v=v[:, :t])


def push_compressed(
  layer_memory: Memory,
  compressed: jax.Array,
  compressed_mask: jax.Array,
  keys_values: Callable[[jax.Array], tuple[jax.Array, jax.Array]] | None = None,
) -> Memory:
  """Pushes compressed slots [B, T/c, d] into the compressed memory (FIFO);
  `keys_values(slots)` gives their keys and values when the memory caches
  them (`RelativeAttention.compressed_keys_values`)."""
  cmem, _ = _fifo(layer_memory.cmem, compressed)
  cmask, _ = _fifo(layer_memory.cmem_mask, compressed_mask)
  out = layer_memory.replace(cmem=cmem, cmem_mask=cmask)
  if layer_memory.cache is not None:
    cache = layer_memory.cache
    assert keys_values is not None  # a cached memory's new slots need their keys and values
    k, v = keys_values(compressed.astype(cache.k.dtype))
    c = layer_memory.compressed_memory_length
    out = out.replace(
      cache=cache.replace(
        k=jnp.concatenate([_fifo(cache.k[:, :c], k)[0], cache.k[:, c:]], 1),
        v=jnp.concatenate([_fifo(cache.v[:, :c], v)[0], cache.v[:, c:]], 1),
      )
    )
  return out
