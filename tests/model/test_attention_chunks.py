"""Query-chunked attention (`attention_chunk_size`) against the whole segment.

Chunking is exact: every query's scores are the whole segment's, only
computed a chunk at a time, so the output, `received` and every gradient
must match the dense path up to float rounding (float32, highest matmul
precision, conftest). The tolerances are about 10x the largest differences
measured (printed by the tests; run with -s to see them). Chunking must
also keep the [B, H, T, K] scores out of the compiled step.
"""

import functools
import math
import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model.attention import RelativeAttention
from helpers import tiny_model_config

# Measured max |chunked - dense| on CPU (B=2, T=8, C+M=6, H=2, D=4, unit
# normal inputs, u and v random; printed by the tests): output 0 (bitwise
# equal), received 3e-8, gradients 4.8e-7 (of values up to 7.4: one float32
# ulp at 7.4). Chunked and dense sum the same terms in a different order.
# The tolerances are ~10x those; the output's allows a few ulps of its O(1)
# values, as another backend need not be bitwise equal.
OUT_ATOL = 5e-7
RECEIVED_ATOL = 3e-7
GRAD_ATOL = 5e-6
# The model (3 segments, test_model_chunked_matches_dense): differences in
# units of float32 eps times the largest |value| of the array compared
# ("ulps of its scale"), the most over parameter and token seeds x 3
# segments x the 3 configurations of the test. JAX 0.10.2, 6 seeds: logits
# and memory bitwise equal, parameter gradients 5.6. JAX 0.12.0.1 (XLA fuses
# rope + conv otherwise), 16 seeds: logits 2.8 (1.2e-6 of logits up to 4.3),
# memory 1.6, gradients 14.1 (1.2e-7 of gradients up to 0.34). A sum reordered over n terms moves
# by up to ~n ulps of its scale, and gradients sum over more terms than
# logits. The tolerances are about four times the largest measured.
MODEL_VALUE_ULPS = 10
MODEL_GRAD_ULPS = 64


def _assert_close_in_ulps(got, want, ulps: float, what: str) -> None:
  """|got - want| within `ulps` float32 eps of want's largest |value|."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  scale = float(np.max(np.abs(want), initial=0.0))
  err = float(np.max(np.abs(got - want), initial=0.0))
  assert err <= ulps * np.finfo(np.float32).eps * scale, (
    f"{what}: {err:.2e} = {err / (np.finfo(np.float32).eps * scale or 1):.1f} ulps of "
    f"its scale {scale:.2e} (at most {ulps})"
  )


def _attention(positions, chunk_size, *, d_model=8, num_heads=2, dropout_rate=0.0):
  """A module whose u, v (relative) are random, not zero, so that their
  gradients and their place in the scores are tested."""
  att = RelativeAttention(
    d_model,
    num_heads,
    dropout_rate=dropout_rate,
    rngs=nnx.Rngs(0),
    positions=positions,
    chunk_size=chunk_size,
  )
  if positions == "relative":
    hd = d_model // num_heads
    att.u[...] = jax.random.normal(jax.random.PRNGKey(10), (num_heads, hd))
    att.v[...] = jax.random.normal(jax.random.PRNGKey(11), (num_heads, hd))
  return att


def _inputs(b=2, t=8, s=6, h=2, d=4, seed=1):
  """q [B, T, H, D]; k, v [B, K, H, D]; r [K, H, D]; valid [B, K] with some
  memory slots (the oldest, as in a filling memory, and one inside) invalid;
  K = S + T."""
  kk = s + t
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(keys[0], (b, t, h, d))
  k = jax.random.normal(keys[1], (b, kk, h, d))
  v = jax.random.normal(keys[2], (b, kk, h, d))
  r = jax.random.normal(keys[3], (kk, h, d))
  valid = jnp.ones((b, kk), bool).at[0, :3].set(False).at[1, 1].set(False)
  return q, k, v, r, valid


def _max_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)  # float64: masks too
  return float(np.max(np.abs(a - b), initial=0.0))


@pytest.mark.parametrize("positions", ["relative", "rope"])
# T = 8: 2 and 4 chunks (one chunk of 8 would take the whole-segment path itself).
@pytest.mark.parametrize("chunk", [4, 2])  # 2 and 4 chunks of 8 queries
@pytest.mark.parametrize("q_last_back", [0, 2])  # 2: the last keys are future ones
def test_chunked_output_and_received_match_dense(positions, chunk, q_last_back):
  q, k, v, r, valid = _inputs()
  kk = k.shape[1]
  q_last = kk - 1 - q_last_back
  dense = _attention(positions, 0)
  chunked = _attention(positions, chunk)
  want, want_received = dense(q, k, v, valid, q_last, r)
  got, got_received = chunked(q, k, v, valid, q_last, r)
  print(
    f"\n{positions} chunk={chunk}: output {_max_err(got, want):.2e}, "
    f"received {_max_err(got_received, want_received):.2e}"
  )
  assert got.shape == want.shape == q.shape[:2] + (8,)
  assert got_received.shape == want_received.shape == valid.shape
  assert got_received.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=0, atol=OUT_ATOL)
  np.testing.assert_allclose(got_received, want_received, rtol=0, atol=RECEIVED_ATOL)
  # received is a mean over heads and queries of weights on valid keys:
  # nothing on an invalid key, and every query's weights sum to 1.
  assert not np.any(np.asarray(got_received)[~np.asarray(valid)])
  np.testing.assert_allclose(np.asarray(got_received).sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("positions", ["relative", "rope"])
def test_fused_rope_chunks_and_need_weights(positions):
  """need_weights=False: rope takes the fused call, per chunk (received
  None); relative still returns received."""
  q, k, v, r, valid = _inputs()
  want, _ = _attention(positions, 0)(q, k, v, valid, k.shape[1] - 1, r, need_weights=False)
  got, received = _attention(positions, 2)(q, k, v, valid, k.shape[1] - 1, r, need_weights=False)
  print(f"\n{positions} need_weights=False: output {_max_err(got, want):.2e}")
  np.testing.assert_allclose(got, want, rtol=0, atol=OUT_ATOL)
  assert (received is None) == (positions == "rope")


@pytest.mark.parametrize("positions", ["relative", "rope"])
@pytest.mark.parametrize("chunk", [4, 2])  # 2 and 4 chunks of 8 queries
@pytest.mark.parametrize("need_weights", [True, False])
def test_chunked_gradients_match_dense(positions, chunk, need_weights):
  """Gradients of a scalar of the output w.r.t. q, k, v, r and the module's
  parameters (wo; u, v for relative positions)."""
  q, k, v, r, valid = _inputs()
  kk = k.shape[1]
  w = jax.random.normal(jax.random.PRNGKey(7), q.shape[:2] + (8,))  # a non-uniform cotangent

  def grads(att):
    graphdef, state = nnx.split(att)

    def loss(params, q, k, v, r):
      out, _ = nnx.merge(graphdef, params)(q, k, v, valid, kk - 1, r, need_weights=need_weights)
      return jnp.sum(out * w)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(state, q, k, v, r)

  want, got = grads(_attention(positions, 0)), grads(_attention(positions, chunk))
  want_params, got_params = want[0], got[0]
  names = ["wo"] + (["u", "v"] if positions == "relative" else [])
  pairs = [(n, got_params[n][...], want_params[n][...]) for n in names]
  pairs += list(zip(["q", "k", "v", "r"], got[1:], want[1:]))
  if positions == "rope":
    pairs = pairs[:-1]  # r is unused in rope mode
  errs = {n: _max_err(g, x) for n, g, x in pairs}
  print(
    f"\n{positions} chunk={chunk} need_weights={need_weights}: gradient errors",
    {n: f"{e:.1e}" for n, e in errs.items()},
    "max |grad|",
    f"{max(float(np.abs(np.asarray(x)).max()) for _, _, x in pairs):.1f}",
  )
  for name, g, x in pairs:
    assert np.any(np.asarray(x)), f"{name}: the dense gradient is zero; the test would be vacuous"
    np.testing.assert_allclose(g, x, rtol=0, atol=GRAD_ATOL, err_msg=name)


def test_chunked_dropout_rate_per_chunk_and_received_before_dropout():
  """With equal scores and v one-hot per key (D = K) and wo the identity,
  the output is the dropped weights themselves: a fraction `rate` of the
  visible weights is zero, the rest scaled by 1 / (1 - rate); chunks draw
  different masks; `received` is the weights before dropout."""
  b, t, s, h, rate, chunk = 2, 8, 8, 2, 0.5, 4
  kk = s + t
  d_model = h * kk
  att = RelativeAttention(
    d_model, h, dropout_rate=rate, rngs=nnx.Rngs(0), positions="relative", chunk_size=chunk
  )
  att.wo[...] = jnp.eye(d_model).reshape(h, kk, d_model)
  q = jnp.zeros((b, t, h, kk))  # u = v = 0 too: every score 0, uniform weights
  k = jax.random.normal(jax.random.PRNGKey(1), (b, kk, h, kk))
  v = jnp.broadcast_to(jnp.eye(kk)[None, :, None, :], (b, kk, h, kk))
  r = jax.random.normal(jax.random.PRNGKey(2), (kk, h, kk))
  valid = jnp.ones((b, kk), bool)
  clean, clean_received = att(q, k, v, valid, kk - 1, r)
  out, received = att(q, k, v, valid, kk - 1, r, dropout_rng=jax.random.PRNGKey(3))
  again, _ = att(q, k, v, valid, kk - 1, r, dropout_rng=jax.random.PRNGKey(3))
  np.testing.assert_array_equal(out, again)  # deterministic given the key
  np.testing.assert_allclose(received, clean_received, rtol=1e-6)
  clean = np.asarray(clean).reshape(b, t, h, kk)
  out = np.asarray(out).reshape(b, t, h, kk)
  visible = clean > 0
  dropped = visible & (out == 0)
  fraction = dropped.sum() / visible.sum()
  print(f"\ndropped fraction {fraction:.3f} of {visible.sum()} visible weights (rate {rate})")
  assert abs(fraction - rate) < 0.1
  kept = visible & ~dropped
  np.testing.assert_allclose(out[kept], clean[kept] / (1 - rate), rtol=1e-5)
  # Chunk 0's and chunk 1's first queries (queries 0 and 4) both see keys
  # 0 .. s: different masks there, as each chunk folds in its index.
  assert np.any(dropped[:, 0, :, : s + 1] != dropped[:, chunk, :, : s + 1])


def _model_step(cfg, tokens_per_segment, seed=0):
  """Logits, memory and parameter gradients of each of the segments in
  turn, the memory threaded from one to the next."""
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(seed))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def step(params, tokens, memory):
    def loss(params):
      logits, new_memory, aux = nnx.merge(graphdef, params, rest)(tokens[:, :-1], memory)
      nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1).mean()
      return nll + aux.reconstruction_loss, (logits, new_memory)

    return jax.grad(loss, has_aux=True)(params)

  memory = compressive.init_memory(cfg, tokens_per_segment[0].shape[0])
  outs = []
  for tokens in tokens_per_segment:
    grads, (logits, memory) = step(params, tokens, memory)
    outs.append((logits, memory, grads))
  return outs


@pytest.mark.slow  # the whole model's gradient step, compiled twice per case
@pytest.mark.parametrize(
  "positions,compression,keys_values",
  [
    ("relative", "conv", "shared"),
    ("rope", "conv", "shared"),
    ("rope", "most_used", "shared"),
    ("relative", "overlap_max_pool", "shared"),
    ("relative", "conv", "own"),
  ],
)
def test_model_chunked_matches_dense(positions, compression, keys_values):
  """The whole model with attention_chunk_size=2 (4 chunks of a segment of
  8) against 0: the same logits, memory and parameter gradients over 3
  segments. rope + conv takes the fused call (no weights needed); most_used
  reads `received` into the memory's usage."""
  t, b = 8, 2
  segments = [jax.random.randint(jax.random.PRNGKey(20 + i), (b, t + 1), 0, 32) for i in range(3)]
  config = functools.partial(
    tiny_model_config,
    segment_length=t,
    positions=positions,
    compression=compression,
    compressed_keys_values=keys_values,
  )
  dense = _model_step(config(attention_chunk_size=0), segments)
  chunked = _model_step(config(attention_chunk_size=2), segments)
  for i, ((logits, mem, grads), (want_logits, want_mem, want_grads)) in enumerate(
    zip(chunked, dense)
  ):
    errs = (
      _max_err(logits, want_logits),
      max(_max_err(a, x) for a, x in zip(jax.tree.leaves(mem), jax.tree.leaves(want_mem))),
      max(_max_err(a, x) for a, x in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads))),
    )
    print(f"\nsegment {i}: logits {errs[0]:.1e}, memory {errs[1]:.1e}, gradients {errs[2]:.1e}")
    _assert_close_in_ulps(logits, want_logits, MODEL_VALUE_ULPS, f"segment {i} logits")
    assert jax.tree.structure(mem) == jax.tree.structure(want_mem)
    for a, x in zip(jax.tree.leaves(mem), jax.tree.leaves(want_mem)):
      _assert_close_in_ulps(a, x, MODEL_VALUE_ULPS, f"segment {i} memory")
    assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
    for (path, a), x in zip(
      jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(want_grads)
    ):
      _assert_close_in_ulps(
        a, x, MODEL_GRAD_ULPS, f"segment {i} gradient {jax.tree_util.keystr(path)}"
      )


def _large_arrays(compiled, numel: int) -> list[str]:
  """The shapes of compiled HLO arrays with at least `numel` elements."""
  found = set()
  for shape in re.findall(r"[fs]\d+\[([\d,]+)\]", compiled.as_text()):
    if math.prod(int(d) for d in shape.split(",")) >= numel:
      found.add(shape)
  return sorted(found)


@pytest.mark.slow  # compiles a long segment's step, dense and chunked
def test_chunked_relative_attention_does_not_materialise_the_scores():
  """Compiled forward + backward of one attention call: no array of the
  chunked step is as large as the [B, H, T, K] scores (the dense one's
  are), and its temporaries stay well below the dense path's."""
  # Long enough that the scores are most of the dense path's temporaries on
  # both JAX 0.10 and 0.11 (at T 256, K 768 XLA 0.11's dense path already
  # keeps less than twice the chunked one's).
  b, h, t, kk, hd, chunk = 2, 4, 512, 1536, 32, 32
  q, k, v, r, valid = _inputs(b=b, t=t, s=kk - t, h=h, d=hd)

  def compile_grad(chunk_size):
    att = _attention("relative", chunk_size, d_model=h * hd, num_heads=h)
    graphdef, state = nnx.split(att)

    def loss(params, q, k, v, r):
      out, received = nnx.merge(graphdef, params)(q, k, v, valid, kk - 1, r)
      return jnp.sum(out) + jnp.sum(received)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
    return grad.lower(state, q, k, v, r).compile()

  dense, chunked = compile_grad(0), compile_grad(chunk)
  dense_bytes = dense.memory_analysis().temp_size_in_bytes
  chunked_bytes = chunked.memory_analysis().temp_size_in_bytes
  scores = b * h * t * kk
  print(
    f"\ntemporaries: dense {dense_bytes / 2**20:.1f} MiB, chunked {chunked_bytes / 2**20:.1f} "
    f"MiB; one [B, H, T, K] float32 array is {scores * 4 / 2**20:.1f} MiB"
  )
  assert _large_arrays(dense, scores), "the dense path should hold [B, H, T, K] arrays"
  assert not _large_arrays(chunked, scores), "the chunked path holds [B, H, T, K]-sized arrays"
  assert chunked_bytes < dense_bytes / 2
