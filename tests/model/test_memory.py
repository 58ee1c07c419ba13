"""FIFO order, validity masks and per-row reset of memory and compressed memory.

A one-layer model's memory holds the embeddings of past tokens, so every slot
can be checked against a plain-Python simulation of the paper's Alg. 1 that
tracks which token (or group of tokens) each slot holds.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model import memory as memory_lib
from compressive.model.compression import COMPRESSIONS
from helpers import jitted_forward, make_model, tiny_model_config

T, M, C, RATE = 4, 6, 3, 2  # M is not a multiple of T: evicted blocks mix old and new


def simulate(num_segments, most_used=False, window=1):
  """Yields (mem_ids, evicted_ids, cmem) after each segment.

  mem_ids: the token in each memory slot (-1 = empty). cmem: for each
  compressed slot, (valid, source ids): pooling and convolutions summarise a
  group of c consecutive evicted slots (a slot of a `window` > 1 reads its
  group and the window - 1 groups before it in the same eviction; valid
  when its own group is); most-used keeps min(valid, T / c) evicted slots,
  so its validity is a count, not a per-group "any".
  """
  mem = [-1] * M
  cmem = [(False, (-1,) * RATE)] * C
  for s in range(num_segments):
    both = mem + list(range(s * T, (s + 1) * T))
    evicted, mem = both[:T], both[T:]
    if most_used:
      k = min(sum(i >= 0 for i in evicted), T // RATE)
      new = [(j >= T // RATE - k, tuple(evicted)) for j in range(T // RATE)]
    else:
      new = [
        (
          any(i >= 0 for i in evicted[i : i + RATE]),
          tuple(evicted[max(0, i - (window - 1) * RATE) : i + RATE]),
        )
        for i in range(0, T, RATE)
      ]
    cmem = (cmem + new)[-C:]
    yield list(mem), list(evicted), list(cmem)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_fifo_order_and_masks_step_by_step(compression):
  cfg = tiny_model_config(
    num_layers=1,
    segment_length=T,
    memory_length=M,
    compressed_memory_length=C,
    compression_rate=RATE,
    compression=compression,
  )
  model = make_model(cfg)
  state, forward = jitted_forward(model)
  emb = np.asarray(model.embed.embedding[...])
  tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(3), (1, 5 * T), 0, cfg.vocab_size))
  memory = compressive.init_memory(cfg, 1)
  vec = lambda i: emb[tokens[0, i]] if i >= 0 else np.zeros(cfg.d_model, np.float32)
  sim = simulate(5, compression == "most_used", COMPRESSIONS[compression].window)
  for s, (mem_ids, evicted_ids, cmem_groups) in enumerate(sim):
    _, memory, _ = forward(state, tokens[:, s * T : (s + 1) * T], memory, None)
    layer = memory.layer(0)
    # Memory: the newest M layer inputs, oldest first; empty slots masked.
    np.testing.assert_array_equal(np.asarray(layer.mem_mask[0]), [i >= 0 for i in mem_ids])
    np.testing.assert_allclose(
      np.asarray(layer.mem[0]), np.stack([vec(i) for i in mem_ids]), rtol=0, atol=0
    )
    # Compressed memory: a slot is valid when any of its group was.
    np.testing.assert_array_equal(np.asarray(layer.cmem_mask[0]), [v for v, _ in cmem_groups])
    cmem = np.asarray(layer.cmem[0])
    for slot, (slot_valid, group) in enumerate(cmem_groups):
      valid = [vec(i) for i in group if i >= 0]
      if not slot_valid:
        np.testing.assert_array_equal(cmem[slot], 0.0)
      elif compression == "mean_pool":
        np.testing.assert_allclose(cmem[slot], np.mean(valid, 0), rtol=1e-6, atol=1e-6)
      elif compression in ("max_pool", "overlap_max_pool"):  # over its window's valid slots
        np.testing.assert_allclose(cmem[slot], np.max(valid, 0), rtol=0, atol=0)
      elif compression == "most_used":
        # One of its eviction's own slots, kept whole.
        assert any(np.array_equal(cmem[slot], v) for v in valid)
    if compression in ("conv", "dilated_conv"):
      # The newest T / c slots are f_c of exactly the evicted block.
      block = np.stack([vec(i) for i in evicted_ids])[None]
      bmask = np.array([[i >= 0 for i in evicted_ids]])
      comp, comp_mask = model.blocks[0].compressor.fn(
        jnp.asarray(block), jnp.asarray(bmask), jnp.zeros(bmask.shape)
      )
      got = cmem[-(T // RATE) :]
      want = np.where(np.asarray(comp_mask[0])[:, None], np.asarray(comp[0]), 0.0)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_most_used_keeps_the_most_attended_in_order():
  from flax import nnx

  comp = COMPRESSIONS["most_used"](2, 3, rngs=nnx.Rngs(0))
  slots = jnp.arange(6 * 3, dtype=jnp.float32).reshape(1, 6, 3)
  usage = jnp.array([[0.9, 0.1, 0.5, 0.7, 0.2, 0.3]])
  mask = jnp.array([[True, True, True, True, True, True]])
  out, out_mask = comp(slots, mask, usage)
  np.testing.assert_array_equal(out[0], slots[0, jnp.array([0, 2, 3])])  # top 3, time order
  assert bool(out_mask.all())
  # An empty slot is never preferred over a valid one, whatever its usage.
  mask = mask.at[0, 0].set(False)
  out, out_mask = comp(slots, mask, usage)
  np.testing.assert_array_equal(out[0], slots[0, jnp.array([2, 3, 5])])


def test_usage_accumulates_attention_received_in_memory_only():
  cfg = tiny_model_config(num_layers=1, compression="most_used")  # M = 2T
  state, forward = jitted_forward(make_model(cfg))
  memory = compressive.init_memory(cfg, 2)
  tokens = jnp.ones((2, cfg.segment_length), jnp.int32)
  _, memory, _ = forward(state, tokens, memory, None)
  # A segment's own tokens earn nothing: they were not in memory yet.
  assert not np.asarray(memory.usage).any() and not np.asarray(memory.visits).any()
  _, memory2, _ = forward(state, tokens, memory, None)
  usage2, visits2 = np.asarray(memory2.usage[0]), np.asarray(memory2.visits[0])
  t = cfg.segment_length
  # The first segment's tokens were in memory for the second: one visit each.
  np.testing.assert_array_equal(visits2, [[1] * t + [0] * t] * 2)
  assert np.all(usage2[:, :t] > 0) and not usage2[:, t:].any()


def _eviction_after(received_per_segment, memory_length, t):
  """Pushes one row of len(received_per_segment) segments of t slots (slot
  ids 1, 2, ... as their only coordinate) into an empty memory of
  memory_length, each segment's memory and tokens receiving the given
  attention; returns the last push's Eviction."""
  layer = memory_lib.Memory(
    mem=jnp.zeros((1, memory_length, 1)),
    mem_mask=jnp.zeros((1, memory_length), bool),
    cmem=jnp.zeros((1, 0, 1)),
    cmem_mask=jnp.zeros((1, 0), bool),
    usage=jnp.zeros((1, memory_length)),
    visits=jnp.zeros((1, memory_length)),
  )
  kv = jnp.zeros((1, memory_length + t, 1, 1))
  for s, received in enumerate(received_per_segment):
    inputs = jnp.arange(s * t + 1, s * t + t + 1, dtype=jnp.float32).reshape(1, t, 1)
    layer, ev = memory_lib.push(layer, inputs, jnp.asarray([received], jnp.float32), kv, kv)
  return ev


def _kept(ev, rate):
  out, out_mask = COMPRESSIONS["most_used"](rate, 1, rngs=None)(ev.slots, ev.mask, ev.usage)
  return [int(i) for i, valid in zip(out[0, :, 0], out_mask[0]) if valid]


def test_most_used_ranks_by_attention_received_while_in_memory():
  # M = T = 4: slots 1-4 are evicted by the second segment. As segment
  # tokens (first segment) 1 and 2 drew the most attention; in memory (the
  # second segment) 3 and 4 did. Only the memory's counts.
  ev = _eviction_after([[0, 0, 0, 0, 9, 9, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0]], memory_length=4, t=4)
  assert _kept(ev, 2) == [3, 4]


def test_most_used_ranks_by_the_average_over_visits():
  # M = 6, T = 4: the third segment evicts 3, 4 (in memory for two
  # segments) and 5, 6 (for one). By sum 3 and 4 lead (0.7, 0.6); by the
  # average per visit 5 (0.5) and 3 (0.35) do.
  ev = _eviction_after(
    [[0] * 10, [0, 0, 0, 0, 0.35, 0.3, 0, 0, 0, 0], [0.35, 0.3, 0.5, 0.1, 0, 0, 0, 0, 0, 0]],
    memory_length=6,
    t=4,
  )
  np.testing.assert_allclose(ev.usage[0], [0.35, 0.3, 0.5, 0.1], rtol=1e-6)
  assert _kept(ev, 2) == [3, 5]


def test_per_row_reset_matches_fresh_memory_and_leaves_other_rows():
  cfg = tiny_model_config()
  state, forward = jitted_forward(make_model(cfg))
  t = cfg.segment_length
  tokens = jax.random.randint(jax.random.PRNGKey(0), (3, 5 * t), 0, cfg.vocab_size)
  memory = compressive.init_memory(cfg, 3)
  for s in range(4):  # fill memory and compressed memory
    _, memory, _ = forward(state, tokens[:, s * t : (s + 1) * t], memory, None)
  seg = tokens[:, 4 * t :]
  sos = jnp.array([False, True, False])
  logits_reset, mem_reset, _ = forward(state, seg, memory, sos)
  logits_keep, mem_keep, _ = forward(state, seg, memory, None)
  fresh_logits, fresh_mem, _ = forward(state, seg, compressive.init_memory(cfg, 3), None)
  np.testing.assert_array_equal(logits_reset[1], fresh_logits[1])
  for a, b in zip(jax.tree.leaves(mem_reset), jax.tree.leaves(fresh_mem)):
    np.testing.assert_array_equal(a[:, 1], b[:, 1])
  for row in (0, 2):
    np.testing.assert_array_equal(logits_reset[row], logits_keep[row])
    for a, b in zip(jax.tree.leaves(mem_reset), jax.tree.leaves(mem_keep)):
      np.testing.assert_array_equal(a[:, row], b[:, row])


def test_init_memory_is_empty_and_sized_from_overrides():
  cfg = tiny_model_config()
  memory = compressive.init_memory(cfg, 2, memory_length=12, compressed_memory_length=10)
  assert memory.mem.shape == (2, 2, 12, 16) and memory.cmem.shape == (2, 2, 10, 16)
  assert not bool(memory.mem_mask.any()) and not bool(memory.cmem_mask.any())


def test_attention_keys_whole_segment_and_decoding():
  """[cmem; mem; segment so far]: the slots' keys (computed, or the cache's)
  before the segment's, validity from the masks, and the last query's key
  index; decoding puts its tokens' keys into the cache's segment."""
  cfg = tiny_model_config(
    segment_length=T,
    memory_length=M,
    compressed_memory_length=C,
    compression_rate=RATE,
    num_layers=1,
  )
  layer = memory_lib.init_memory(cfg, 2).layer(0)
  rng = np.random.default_rng(0)
  layer = layer.replace(
    mem=jnp.asarray(rng.normal(size=layer.mem.shape), jnp.float32),
    cmem=jnp.asarray(rng.normal(size=layer.cmem.shape), jnp.float32),
    mem_mask=jnp.asarray(rng.random(layer.mem_mask.shape) < 0.5),
    cmem_mask=jnp.asarray(rng.random(layer.cmem_mask.shape) < 0.5),
  )
  both = lambda cmem, mem: jnp.concatenate([cmem, mem], 1)[:, :, None]  # H = 1
  keys_values = lambda cmem, mem: (2 * both(cmem, mem), 3 * both(cmem, mem))
  x = jnp.asarray(rng.normal(size=(2, T, 1, cfg.d_model)), jnp.float32)
  k, v, valid, q_last, same = memory_lib.attention_keys(layer, keys_values, x, -x)
  slots = jnp.concatenate([layer.cmem, layer.mem], 1)[:, :, None]
  np.testing.assert_array_equal(k, jnp.concatenate([2 * slots, x], 1))
  np.testing.assert_array_equal(v, jnp.concatenate([3 * slots, -x], 1))
  np.testing.assert_array_equal(
    valid, jnp.concatenate([layer.cmem_mask, layer.mem_mask, jnp.ones((2, T), bool)], 1)
  )
  assert q_last == C + M + T - 1 and same is layer

  k_past, v_past = keys_values(layer.cmem, layer.mem)
  seg = jnp.zeros((2, T, 1, cfg.d_model))
  cached = layer.replace(cache=memory_lib.KeysValues(k=k_past, v=v_past, seg_k=seg, seg_v=seg))
  for p in range(T):  # one token at a time, as sampling decodes
    k, v, valid, q_last, cached = memory_lib.attention_keys(
      cached, keys_values, x[:, p : p + 1], -x[:, p : p + 1], jnp.asarray(p)
    )
    assert int(q_last) == C + M + p
    np.testing.assert_array_equal(
      k[:, : C + M + p + 1], jnp.concatenate([2 * slots, x[:, : p + 1]], 1)
    )
    np.testing.assert_array_equal(v[:, C + M : C + M + p + 1], -x[:, : p + 1])
    np.testing.assert_array_equal(valid[:, C + M :], jnp.broadcast_to(jnp.arange(T) <= p, (2, T)))
  np.testing.assert_array_equal(cached.cache.seg_k, x)
