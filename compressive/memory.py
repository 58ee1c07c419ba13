"""The memory: per-layer FIFO memory and compressed memory (paper §3, Alg. 1).

Notation: L layers, B batch rows, M memory slots (n_m), C compressed-memory
slots (n_cm), T segment length (n_s), c compression rate, d model width.

The memory is a plain pytree value threaded through the model, never hidden
module state. At model level every array carries a leading layer axis
(`mem [L, B, M, d]`); the per-layer helpers below see the same class with that
axis sliced off (`mem [B, M, d]`). Slots are ordered oldest first. Empty slots
are marked invalid in the masks and are never attended, so a row can be reset
mid-batch without zero-filling tricks (PAPER.md, §3).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from compressive import config_lib


@flax.struct.dataclass
class Memory:
  """Memory and compressed memory of past layer inputs.

  Sizes are read from the shapes, so evaluation may build a larger memory than
  training did (PAPER.md: enwik8 evaluates with n_cm = 3072).
  """

  mem: jax.Array  # [L, B, M, d] past layer inputs, oldest first
  mem_mask: jax.Array  # [L, B, M] bool: the slot holds a real token
  cmem: jax.Array  # [L, B, C, d] compressed past, oldest first
  cmem_mask: jax.Array  # [L, B, C] bool
  usage: jax.Array  # [L, B, M] float32 attention each memory slot received

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
    model_config,
    batch_size: int,
    dtype=jnp.float32,
    *,
    memory_length: Optional[int] = None,
    compressed_memory_length: Optional[int] = None,
) -> Memory:
  """A memory whose slots are all empty (masked).

  Args:
    model_config: the `model` ConfigDict (or a `ModelConfig`).
    batch_size: rows of this memory (process-local or global, as the caller
      needs).
    dtype: storage dtype of the slots (the model's compute dtype).
    memory_length: overrides `model_config.memory_length` (evaluation).
    compressed_memory_length: overrides `compressed_memory_length`.
  """
  cfg = config_lib.ModelConfig.from_config(model_config)
  m = cfg.memory_length if memory_length is None else memory_length
  cm = (cfg.compressed_memory_length
        if compressed_memory_length is None else compressed_memory_length)
  config_lib.check_memory_sizes(cfg, m, cm, batch_size)
  layers, d = cfg.num_layers, cfg.d_model
  return Memory(
      mem=jnp.zeros((layers, batch_size, m, d), dtype),
      mem_mask=jnp.zeros((layers, batch_size, m), bool),
      cmem=jnp.zeros((layers, batch_size, cm, d), dtype),
      cmem_mask=jnp.zeros((layers, batch_size, cm), bool),
      usage=jnp.zeros((layers, batch_size, m), jnp.float32),
  )


def reset_rows(memory: Memory, start_of_sequence: jax.Array) -> Memory:
  """Empties the rows that start a new document; other rows are untouched.

  Args:
    memory: model-level memory (leading layer axis).
    start_of_sequence: bool [B].
  """
  sos = jnp.asarray(start_of_sequence, bool)

  def reset(a):
    # Batch is axis 1 of every field; broadcast the flag over the rest.
    flag = sos.reshape((1, -1) + (1,) * (a.ndim - 2))
    return jnp.where(flag, jnp.zeros_like(a), a)

  return jax.tree.map(reset, memory)


@flax.struct.dataclass
class Eviction:
  """The oldest slots pushed out of one layer's memory by a segment."""

  slots: jax.Array  # [B, T, d] oldest first
  mask: jax.Array  # [B, T] bool
  usage: jax.Array  # [B, T] attention received while in memory


def push(
    layer_memory: Memory,
    inputs: jax.Array,
    received: jax.Array,
) -> tuple[Memory, Eviction]:
  """Pushes a segment's layer inputs into one layer's memory (FIFO).

  Args:
    layer_memory: one layer's memory (no layer axis).
    inputs: [B, T, d] the segment's inputs to this layer.
    received: [B, M + T] attention each memory slot and segment token received
      in this segment (mean over heads and queries); accumulates into `usage`
      for the most-used compression.

  Returns:
    The memory with the newest M of [memory; inputs] kept (compressed memory
    unchanged), and the T oldest slots that fell out, with their validity and
    usage. With M = 0 nothing is kept and the inputs themselves are "evicted".
  """
  b, t, _ = inputs.shape
  m = layer_memory.memory_length
  slots = jnp.concatenate([layer_memory.mem, inputs.astype(layer_memory.mem.dtype)], axis=1)
  mask = jnp.concatenate([layer_memory.mem_mask, jnp.ones((b, t), bool)], axis=1)
  usage = jnp.concatenate(
      [layer_memory.usage, jnp.zeros((b, t), jnp.float32)], axis=1) + received
  evicted = Eviction(slots=slots[:, :t], mask=mask[:, :t], usage=usage[:, :t])
  kept = dataclasses.replace(
      layer_memory, mem=slots[:, t:], mem_mask=mask[:, t:], usage=usage[:, t:])
  assert kept.mem.shape[1] == m
  return kept, evicted


def push_compressed(
    layer_memory: Memory, compressed: jax.Array, compressed_mask: jax.Array
) -> Memory:
  """Pushes compressed slots [B, T/c, d] into the compressed memory (FIFO)."""
  n = compressed.shape[1]
  cmem = jnp.concatenate(
      [layer_memory.cmem, compressed.astype(layer_memory.cmem.dtype)], axis=1)
  cmask = jnp.concatenate([layer_memory.cmem_mask, compressed_mask], axis=1)
  return dataclasses.replace(layer_memory, cmem=cmem[:, n:], cmem_mask=cmask[:, n:])
