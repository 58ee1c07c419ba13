"""Model-level promises: temporal range, segment-by-segment == whole sequence,
scan under jit, determinism, and the Transformer-XL / local special cases."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model import compression as compression_lib
from helpers import jitted_forward, make_model, run_segments, tiny_model_config

# Every compression the package registers, read from its registry, so that a
# new one is held to the temporal range without being listed here (a toy one
# a test file registers is not the package's).
BUILT_IN_COMPRESSIONS = sorted(
  name
  for name, cls in compression_lib.COMPRESSIONS.items()
  if cls.__module__ == compression_lib.__name__
)


def test_the_built_in_compressions_are_all_here():
  # The temporal-range test below runs over this list: it is the registry's.
  assert {"max_pool", "mean_pool", "conv", "dilated_conv", "most_used"} <= set(
    BUILT_IN_COMPRESSIONS
  )


@pytest.mark.parametrize("compression", BUILT_IN_COMPRESSIONS)
def test_temporal_range_of_one_layer(compression):
  # One layer: a past token reaches the last segment only when it lies within
  # n_m + c * n_cm tokens before it (paper §3). A compression that combines
  # every slot of a group (pooling, convolutions) passes each evicted token
  # on, so exactly those tokens reach it; one that selects slots
  # (`needs_usage`: most_used keeps n_cm of c * n_cm) passes on only those it
  # keeps, so the memory's n_m tokens reach it. Older tokens may still
  # steer which slots it keeps (a slot's usage is its share of softmaxes that
  # every slot in memory took part in; measured: tokens beyond the range do
  # change the last segment for most_used), so for it only the kept slots'
  # contents are bounded, which tests/model/test_memory.py checks slot by slot.
  t, m, cm, c = 4, 4, 3, 2
  reach = m + c * cm  # 10
  cfg = tiny_model_config(
    num_layers=1,
    segment_length=t,
    memory_length=m,
    compressed_memory_length=cm,
    compression_rate=c,
    compression=compression,
  )
  state, forward = jitted_forward(make_model(cfg))
  n_seg = 6
  start = (n_seg - 1) * t  # first token of the last segment
  base = jax.random.randint(jax.random.PRNGKey(0), (1, n_seg * t), 0, cfg.vocab_size)
  # Row 0 is unperturbed; row d perturbs the token d positions before `start`.
  distances = np.arange(1, start + 1)
  batch = jnp.repeat(base, len(distances) + 1, 0)
  batch = batch.at[distances, start - distances].set(
    (base[0, start - distances] + 7) % cfg.vocab_size
  )
  logits, _ = run_segments(forward, state, batch, compressive.init_memory(cfg, batch.shape[0]), t)
  last = np.asarray(logits[:, start:])
  changed = np.abs(last[1:] - last[:1]).max(axis=(1, 2)) > 0
  cls = compression_lib.COMPRESSIONS[compression]
  if cls.needs_usage:
    assert changed[distances <= m].all()
  else:
    # A window over earlier groups of the same eviction (overlap_max_pool)
    # reaches c * (window - 1) tokens further, for the slots whose window
    # holds them; no token beyond that.
    assert changed[distances <= reach].all()
    assert not changed[distances > reach + c * (cls.window - 1)].any()
    if cls.window == 1:
      np.testing.assert_array_equal(changed, distances <= reach)
    else:
      assert changed[(distances > reach) & (distances <= reach + c * (cls.window - 1))].any()


@pytest.mark.parametrize("layers", [1, 3])
def test_segment_by_segment_equals_whole_sequence(layers):
  # No compressed memory and a memory as long as the sequence: the recurrence
  # must reproduce one pass over the whole sequence (positions and masks).
  t, n_seg = 4, 5
  total = t * n_seg
  cfg = tiny_model_config(
    num_layers=layers, segment_length=t, memory_length=total, compressed_memory_length=0
  )
  state, forward = jitted_forward(make_model(cfg))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, total), 0, cfg.vocab_size)
  seg_logits, _ = run_segments(forward, state, tokens, compressive.init_memory(cfg, 2), t)
  whole, _, _ = forward(state, tokens, compressive.init_memory(cfg, 2), None)
  np.testing.assert_allclose(np.asarray(seg_logits), np.asarray(whole), rtol=1e-5, atol=1e-5)


def test_scan_under_jit_matches_eager_and_does_not_retrace():
  cfg = tiny_model_config()
  model = make_model(cfg)
  graphdef, state = nnx.split(model)
  t, n_seg = cfg.segment_length, 6
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, n_seg * t), 0, cfg.vocab_size)
  segments = tokens.reshape(2, n_seg, t).transpose(1, 0, 2)  # [S, B, T]
  sos = jnp.zeros((n_seg, 2), bool).at[0].set(True).at[3, 1].set(True)
  traces = []

  @jax.jit
  def scanned(state, memory, segments, sos):
    traces.append(1)
    m = nnx.merge(graphdef, state)

    def body(memory, xs):
      seg, flag = xs
      logits, memory, aux = m(seg, memory, flag)
      return memory, (logits, aux.reconstruction_loss)

    return jax.lax.scan(body, memory, (segments, sos))

  memory0 = compressive.init_memory(cfg, 2)
  final, (logits, recon) = scanned(state, memory0, segments, sos)
  scanned(state, final, segments, sos)  # new values, same shapes
  assert len(traces) == 1

  memory = memory0
  for s in range(n_seg):
    want, memory, aux = model(segments[s], memory, sos[s])
    np.testing.assert_allclose(np.asarray(logits[s]), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
      float(recon[s]), float(aux.reconstruction_loss), rtol=1e-5, atol=1e-7
    )
  for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(memory)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_dropout_needs_a_key_and_eval_mode_is_deterministic():
  cfg = tiny_model_config(dropout_rate=0.5)
  model = make_model(cfg)
  memory = compressive.init_memory(cfg, 1)
  tokens = jnp.arange(cfg.segment_length)[None] % cfg.vocab_size
  a, _, _ = model(tokens, memory, dropout_rng=jax.random.PRNGKey(0))
  b, _, _ = model(tokens, memory, dropout_rng=jax.random.PRNGKey(1))
  assert not np.allclose(a, b)
  c, _, _ = model(tokens, memory)  # no key: deterministic
  model.eval()
  d, _, _ = model(tokens, memory, dropout_rng=jax.random.PRNGKey(0))
  np.testing.assert_array_equal(c, d)


@pytest.mark.parametrize("m,cm", [(0, 0), (8, 0), (8, 4)])
def test_same_code_for_local_transformer_xl_and_compressive(m, cm):
  cfg = tiny_model_config(memory_length=m, compressed_memory_length=cm)
  model = make_model(cfg)
  has_compressor = any("compressor" in str(p) for p, _ in nnx.to_flat_state(nnx.state(model)))
  assert has_compressor == (cm > 0)
  state, forward = jitted_forward(model)
  memory = compressive.init_memory(cfg, 2)
  tokens = jnp.ones((2, 3 * cfg.segment_length), jnp.int32)
  logits, memory = run_segments(forward, state, tokens, memory, cfg.segment_length)
  assert logits.shape == (2, 3 * cfg.segment_length, cfg.vocab_size)
  assert memory.mem.shape[2] == m and memory.cmem.shape[2] == cm
  assert np.all(np.isfinite(np.asarray(logits)))


def test_evaluation_may_use_longer_memories_and_other_segment_lengths():
  cfg = tiny_model_config()  # trained with n_m = 8, n_cm = 4, T = 4
  state, forward = jitted_forward(make_model(cfg))
  memory = compressive.init_memory(cfg, 1, memory_length=16, compressed_memory_length=12)
  tokens = jnp.ones((1, 8), jnp.int32)
  for _ in range(6):  # 16 memory slots fill after 2 segments; then 4 slots a segment
    logits, memory, aux = forward(state, tokens, memory, None)
  assert (
    bool(memory.cmem_mask.all()) and float(aux.scalars()["attention_mass/compressed_memory"]) > 0
  )
  with pytest.raises(ValueError, match="multiple of compression_rate"):
    forward(state, jnp.ones((1, 5), jnp.int32), memory, None)


def test_attention_mass_sums_to_one():
  cfg = tiny_model_config()
  state, forward = jitted_forward(make_model(cfg))
  memory = compressive.init_memory(cfg, 2)
  for _ in range(5):
    _, memory, aux = forward(state, jnp.ones((2, 4), jnp.int32), memory, None)
  total = sum(
    float(aux.scalars()[f"attention_mass/{k}"]) for k in ("compressed_memory", "memory", "segment")
  )
  assert abs(total - 1.0) < 1e-5


def test_bfloat16_compute_keeps_float32_parameters():
  cfg = tiny_model_config(dtype="bfloat16")
  model = make_model(cfg)
  assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype("float32")}
  state, forward = jitted_forward(model)
  memory = compressive.init_memory(cfg, 2, jnp.bfloat16)
  for _ in range(4):
    logits, memory, aux = forward(state, jnp.ones((2, 4), jnp.int32), memory, None)
  assert logits.dtype == jnp.float32 and memory.mem.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(logits))) and float(aux.reconstruction_loss) > 0


def test_own_compressed_projections_read_the_compressed_slots_only():
  # model.compressed_keys_values="own": W_k^c and W_v^c project the
  # compressed slots and nothing else. Changing them changes no logit while
  # the compressed memory is empty, and changes the logits once it holds
  # slots; the memory's and the segment's keys stay W_k's.
  cfg = tiny_model_config(compressed_keys_values="own", num_layers=1)
  model = make_model(cfg, seed=2)
  state, forward = jitted_forward(model)
  t = cfg.segment_length
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 8 * t), 0, cfg.vocab_size)
  # A random change, not a constant one: a constant c added to every entry
  # of W adds c times the sum of LN(x)'s features, which is zero (LayerNorm
  # centres them), and would change the keys by rounding only.
  noise = lambda a: 0.5 * jax.random.normal(jax.random.PRNGKey(7), a.shape, a.dtype)
  other = jax.tree_util.tree_map_with_path(
    lambda path, a: (
      a + noise(a) if any(getattr(k, "key", None) in ("wkc", "wvc") for k in path) else a
    ),
    state,
  )
  memory = model.init_memory(2)
  for s in range(8):
    seg = tokens[:, s * t : (s + 1) * t]
    want, next_memory, _ = forward(state, seg, memory, None)
    got, _, _ = forward(other, seg, memory, None)
    if bool(memory.cmem_mask.any()):  # far above float rounding (~1e-6)
      assert np.abs(got - want).max() > 1e-2, f"segment {s}: W_k^c, W_v^c unread"
    else:
      np.testing.assert_array_equal(got, want, err_msg=f"segment {s}")
    memory = next_memory
  assert bool(memory.cmem_mask.any())


def test_own_compressed_projections_need_a_compressed_memory():
  with pytest.raises(
    compressive.ConfigError, match="compressed_keys_values='own' needs a compressed memory"
  ):
    tiny_model_config(compressed_keys_values="own", compressed_memory_length=0)
