"""The model in evaluation: what a stream threads between segments, and
the stream's one call of the model.

`Carry` holds the memory (with its slots' keys and values when cached) and
every layer's position keys, both computed once while the weights do not
change. `init_carry` and `run_model` are evaluation's only uses of the
model's key/value cache, position keys, call and aux; the jitted stream
step that calls them, and where it runs, are compressive/evaluation/evaluate.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Self

import flax.struct
import jax
import jax.numpy as jnp

from compressive.model import memory as memory_lib
from compressive.model.transformer import CompressiveTransformer


@flax.struct.dataclass
class Carry:
  """What a stream threads from one segment to the next: the memory (with
  its slots' keys and values when cached) and every layer's W_r R for the
  segment length (None in rope mode), both computed once while the weights
  do not change."""

  memory: memory_lib.Memory
  position_keys: Optional[jax.Array]  # [L, C + M + 2T - 1, H, D]

  if TYPE_CHECKING:  # flax.struct.dataclass adds it; its stub does not declare it

    def replace(self, **updates: Any) -> Self: ...


def init_carry(
  model: CompressiveTransformer, memory: memory_lib.Memory, cached: bool, segment_length: int
) -> Carry:
  """The carry a stream starts from: with `cached`, the memory carries
  every slot's keys and values, computed once when the slot enters the
  memory instead of every segment; W_r R is computed here once instead of in
  every segment. The results are the same."""
  memory = model.cache_keys_values(memory, segment_length=0) if cached else memory
  return Carry(memory, model.position_keys(memory, segment_length))


def run_model(
  model: CompressiveTransformer,
  carry: Carry,
  batch: dict[str, jax.Array],
  collect_attention: bool,
  probe: bool = False,
) -> tuple[Carry, jax.Array, Optional[dict[str, jax.Array]]]:
  """(carry, logits, attention) of one segment: evaluation's one call of the
  model and its one reader of the model's aux. `attention` is None, or a
  dict of `Segment` fields: with `collect_attention` attention_by_key and
  memory_valid; with `probe` compressed_slots, compressed_weights and
  memory_valid.
  """
  memory, t = carry.memory, batch["inputs"].shape[1]
  rows = memory.compressed_memory_length + memory.memory_length + 2 * t - 1
  if carry.position_keys is not None and carry.position_keys.shape[1] != rows:
    raise ValueError(f"the stream's position keys are for another segment length than {t}")
  logits, new_memory, aux = model(
    batch["inputs"],
    memory,
    batch["start_of_sequence"],
    collect_attention=collect_attention,
    position_keys=carry.position_keys,
    attention_weights=probe,
  )
  attention = None
  if collect_attention or probe:
    attended = memory_lib.reset_rows(memory, batch["start_of_sequence"])
    attention = dict(
      memory_valid=jnp.concatenate([attended.cmem_mask[0], attended.mem_mask[0]], axis=-1)
    )
    if collect_attention:
      assert aux.attention_by_key is not None  # collect_attention fills it
      attention["attention_by_key"] = aux.attention_by_key
    if probe:
      assert aux.attention_weights is not None  # attention_weights=probe fills it
      c = attended.compressed_memory_length
      attention.update(
        compressed_slots=attended.cmem, compressed_weights=aux.attention_weights[..., :c]
      )
  return carry.replace(memory=new_memory), logits, attention
