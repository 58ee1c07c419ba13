"""Relative attention: the position shift, and causality inside a segment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.attention import causal_mask, rel_shift
from conftest import jitted_forward, make_model, tiny_model_config


@pytest.mark.parametrize("t,k", [(4, 4), (4, 12), (3, 10), (1, 5)])
def test_rel_shift_matches_gather(t, k):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, t, k))
  got = np.asarray(rel_shift(x))
  x = np.asarray(x)
  s = k - t
  for i in range(t):
    for j in range(s + i + 1):  # every visible key
      dist = s + i - j
      # x[..., i, p] is distance K - 1 - p.
      np.testing.assert_array_equal(got[..., i, j], x[..., i, k - 1 - dist])


def test_causal_mask_bottom_right_and_validity():
  valid = jnp.array([[False, True, True, True, True, True]])  # S = 3, T = 3
  m = np.asarray(causal_mask(valid, 3))[0, 0]
  expected = np.array([
      [0, 1, 1, 1, 0, 0],
      [0, 1, 1, 1, 1, 0],
      [0, 1, 1, 1, 1, 1],
  ], bool)
  np.testing.assert_array_equal(m, expected)


@pytest.mark.parametrize("memory", [0, 8])
def test_causality_inside_a_segment(memory):
  t = 8
  cfg = tiny_model_config(segment_length=t, memory_length=memory,
                          compressed_memory_length=4 if memory else 0)
  state, forward = jitted_forward(make_model(cfg))
  rows = t + 1  # row 0 unchanged, row 1 + p perturbs position p
  key = jax.random.PRNGKey(1)
  prev = jax.random.randint(key, (1, t), 0, cfg.vocab_size)
  _, mem, _ = forward(state, jnp.repeat(prev, rows, 0), compressive.init_memory(cfg, rows), None)
  tokens = jax.random.randint(jax.random.fold_in(key, 1), (1, t), 0, cfg.vocab_size)
  batch = jnp.repeat(tokens, rows, 0)
  pos = jnp.arange(t)
  batch = batch.at[1 + pos, pos].set((tokens[0] + 1) % cfg.vocab_size)
  out, _, _ = forward(state, batch, mem, None)
  diff = np.abs(np.asarray(out[1:] - out[:1])).max(-1)  # [perturbed p, T]
  for p in range(t):
    assert np.all(diff[p, :p] == 0.0), f"position {p} leaked into the past"
    assert diff[p, p] > 0.0
