"""Evaluation's key/value cache: each memory slot's keys and values are
computed once, when the slot enters the memory, and give the same results."""

import jax.numpy as jnp
import numpy as np
import pytest

from compressive.evaluation import evaluate as eval_lib
from compressive.model.compression import COMPRESSIONS
from helpers import make_model, tiny_model_config


@pytest.mark.parametrize(
  "compression,positions,keys_values",
  [(c, "relative", "shared") for c in COMPRESSIONS]
  + [
    ("conv", "rope", "shared"),
    ("most_used", "rope", "shared"),
    ("conv", "relative", "own"),
    ("max_pool", "rope", "own"),
  ],
)
def test_cached_keys_values_give_the_uncached_logits(compression, positions, keys_values):
  # Rotary keys are cached unrotated (a slot's index shifts every segment)
  # and rotated at use; the cache must hold exactly the memory's own (the
  # compressed slots' through their own projections, with "own").
  cfg = tiny_model_config(
    compression=compression,
    compressed_memory_length=6,
    positions=positions,
    compressed_keys_values=keys_values,
  )
  model = make_model(cfg, seed=1)
  model.eval()
  rng = np.random.default_rng(0)
  b, t = 3, cfg.segment_length
  mem0 = model.init_memory(b)
  plain, cached = mem0, model.cache_keys_values(mem0)
  # Enough segments to fill memory and compressed memory; rows restart at
  # different times so reset rows hold stale cache entries.
  for s in range(12):
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, t)), jnp.int32)
    sos = jnp.asarray([s == 0, s in (0, 5), s in (0, 9)])
    want, plain, _ = model(tokens, plain, sos)
    got, cached, _ = model(tokens, cached, sos)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=f"segment {s}")
    # The carried cache is the memory's own keys and values, slot for slot,
    # wherever a slot is valid.
    fresh = model.cache_keys_values(cached.replace(cache=None)).cache
    mask = np.concatenate([cached.cmem_mask, cached.mem_mask], -1)  # [L, B, C + M]
    for name in "kv":
      np.testing.assert_allclose(
        np.asarray(getattr(cached.cache, name))[mask],
        np.asarray(getattr(fresh, name))[mask],
        atol=2e-5,
        rtol=2e-5,
        err_msg=name,
      )


def test_eval_step_with_and_without_the_cache_agree():
  cfg = tiny_model_config()
  model = make_model(cfg, seed=2)
  model.eval()
  b, t = 2, cfg.segment_length
  totals = []
  for cache in (False, True):
    init, step = eval_lib.make_eval_step(model, cache_keys_values=cache)
    carry = init(model.init_memory(b))
    data = np.random.default_rng(1)
    total = 0.0
    for s in range(8):
      tokens = data.integers(0, cfg.vocab_size, (b, t + 1)).astype(np.int32)
      batch = dict(
        inputs=tokens[:, :-1],
        targets=tokens[:, 1:],
        mask=np.ones((b, t), bool),
        start_of_sequence=np.full((b,), s == 0),
      )
      carry, nats, count = step(carry, batch)
      assert float(count) == b * t
      total += float(nats)
    totals.append(total)
  assert totals[1] == pytest.approx(totals[0], rel=1e-5)
