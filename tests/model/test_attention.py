"""Relative attention: the position shift, and causality inside a segment."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model.attention import causal_mask, rel_shift
from helpers import jitted_forward, make_model, tiny_model_config


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
  expected = np.array(
    [
      [0, 1, 1, 1, 0, 0],
      [0, 1, 1, 1, 1, 0],
      [0, 1, 1, 1, 1, 1],
    ],
    bool,
  )
  np.testing.assert_array_equal(m, expected)


@pytest.mark.parametrize("memory", [0, 8])
def test_causality_inside_a_segment(memory):
  t = 8
  cfg = tiny_model_config(
    segment_length=t, memory_length=memory, compressed_memory_length=4 if memory else 0
  )
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


def _reference_layer_norm(x, scale, bias, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


@pytest.mark.parametrize("frozen", [False, True])
def test_layer_norm_hand_written_gradient_matches_autodiff(frozen):
  """LayerNorm's custom backward (one pass, for speed) equals the gradient
  of the textbook formula, for x and, unless frozen, for scale and bias."""
  from compressive.model.attention import LayerNorm
  from compressive.model.transformer import merge_params

  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  x = 3.0 * jax.random.normal(keys[0], (2, 5, 16)) + 1.0
  w = jax.random.normal(keys[1], (2, 5, 16))  # a cotangent that is not all ones
  ln = LayerNorm(16)
  ln.scale[...] = 1.0 + 0.1 * jax.random.normal(keys[2], (16,))
  ln.bias[...] = 0.1 * jax.random.normal(keys[3], (16,))
  scale, bias = ln.scale[...], ln.bias[...]
  graphdef, state = nnx.split(ln)

  def ours(x, scale, bias):
    ln = merge_params(graphdef, state, {"scale": scale, "bias": bias})
    return jnp.sum(ln(x, frozen=frozen) * w)

  def reference(x, scale, bias):
    if frozen:
      scale, bias = jax.lax.stop_gradient((scale, bias))
    return jnp.sum(_reference_layer_norm(x, scale, bias) * w)

  np.testing.assert_allclose(ours(x, scale, bias), reference(x, scale, bias), rtol=1e-5)
  got = jax.grad(ours, argnums=(0, 1, 2))(x, scale, bias)
  want = jax.grad(reference, argnums=(0, 1, 2))(x, scale, bias)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
  if frozen:
    assert not np.any(np.asarray(got[1])) and not np.any(np.asarray(got[2]))


def test_masked_softmax_value_and_gradient_match_autodiff():
  """The attention softmax's custom backward equals autodiff of softmax
  over masked logits; masked entries get weight 0 and gradient 0."""
  from compressive.model.attention import masked_softmax

  logits = 4.0 * jax.random.normal(jax.random.PRNGKey(2), (2, 3, 4, 6))
  mask = causal_mask(jnp.array([[True] * 6, [False, True] + [True] * 4]), 4)  # [2, 1, 4, 6]
  w = jax.random.normal(jax.random.PRNGKey(3), logits.shape)
  reference = lambda z: jax.nn.softmax(jnp.where(mask, z, -1e30), axis=-1)
  p = masked_softmax(logits, mask)
  np.testing.assert_allclose(p, reference(logits), rtol=1e-6, atol=1e-7)
  assert not np.any(np.asarray(p)[~np.broadcast_to(np.asarray(mask), p.shape)])
  got = jax.grad(lambda z: jnp.sum(masked_softmax(z, mask) * w))(logits)
  want = jax.grad(lambda z: jnp.sum(reference(z) * w))(logits)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert not np.any(np.asarray(got)[~np.broadcast_to(np.asarray(mask), got.shape)])
