"""model.positions = "rope": rotary positions over [cmem; mem; segment].

The promises of the relative mode hold unchanged (causality, segment by
segment == whole sequence, cached evaluation and sampling); in addition the
fused output (`jax.nn.dot_product_attention`) equals the explicit one, and no
position parameters exist.
"""

import importlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive import config as config_lib
from compressive.errors import ConfigError
from compressive.model import attention as attention_lib
from compressive.model.config import ModelConfig
from compressive.model.sampling import Sampler
from compressive.scale import mesh_checks, sharding
from helpers import (
  checked,
  greedy_without_cache,
  jitted_forward,
  make_model,
  run_segments,
  tiny_model_config,
)


def mesh_of(config):
  """The MeshConfig of a (test) config's mesh section."""
  return sharding.MeshConfig.from_config(config.mesh)


def rope_config(**overrides):
  return tiny_model_config(positions="rope", **overrides)


def test_rotary_scores_depend_only_on_the_index_distance():
  q, k = jax.random.normal(jax.random.PRNGKey(0), (2, 1, 5, 2, 8))
  i, j = jnp.arange(5) + 7, jnp.arange(5)

  def scores(shift):
    return jnp.einsum(
      "bihe,bjhe->bhij", attention_lib.rotate(q, i + shift), attention_lib.rotate(k, j + shift)
    )

  np.testing.assert_allclose(scores(0), scores(1000), atol=1e-4)
  assert not np.allclose(scores(0), jnp.einsum("bihe,bjhe->bhij", q, k), atol=1e-3)


def test_rope_has_no_position_parameters_and_partitions():
  def names(cfg):
    params = nnx.to_pure_dict(nnx.state(make_model(cfg), nnx.Param))
    return set(params["blocks"][0]["attention"])

  assert names(rope_config()) == {"norm", "wq", "wk", "wv", "wo"}
  assert names(tiny_model_config()) == {"norm", "wq", "wk", "wv", "wo", "wr", "u", "v"}

  # The default rules name attention/wr, u, v; with none of them present the
  # rest must still partition, heads on 'tensor' and width on 'fsdp'.
  config = importlib.import_module("compressive.configs.default_rope").get_config()
  config.model.update(
    dict(
      num_layers=1,
      d_model=16,
      num_heads=2,
      d_ff=32,
      segment_length=4,
      memory_length=8,
      compressed_memory_length=4,
    )
  )
  config.batch_size = 4
  config.mesh.shape = (1, 2, 2)
  model = ModelConfig.from_config(config.model)
  state = nnx.state(
    nnx.eval_shape(lambda: compressive.CompressiveTransformer(model, rngs=nnx.Rngs(0)))
  )
  assert mesh_checks.validate(mesh_of(config), state, batch_size=4, model=model, num_devices=4) == (
    1,
    2,
    2,
  )
  att = sharding.param_specs(mesh_of(config), state)["blocks"][0]["attention"]
  P = jax.sharding.PartitionSpec
  assert att["wq"] == P("fsdp", "tensor", None) and att["wo"] == P("tensor", None, "fsdp")
  assert "wr" not in att


def test_default_rope_config_differs_from_default_only_in_positions():
  default = importlib.import_module("compressive.configs.default").get_config()
  rope = importlib.import_module("compressive.configs.default_rope").get_config()
  assert default.model.positions == "relative" and rope.model.positions == "rope"
  rope.model.positions = "relative"
  assert rope.to_dict() == default.to_dict()


def test_bad_positions_are_config_errors():
  with pytest.raises(
    ConfigError, match=r"model.positions='alibi' is unknown; choose one of relative, rope"
  ):
    ModelConfig.from_config(tiny_model_config(positions="alibi"))
  with pytest.raises(ConfigError, match="model.positions='rope'.*even"):
    ModelConfig.from_config(tiny_model_config(positions="rope", d_model=6, num_heads=2))
  assert ModelConfig.from_config(tiny_model_config()).positions == "relative"


def test_rope_is_causal():
  # Changing token p changes no logit before p (in its segment or earlier
  # ones) and some logit at p.
  cfg = rope_config()
  state, forward = jitted_forward(make_model(cfg))
  t, n_seg = cfg.segment_length, 4
  tokens = jax.random.randint(jax.random.PRNGKey(3), (1, n_seg * t), 0, cfg.vocab_size)
  points = [1, 6, 13]  # inside segments 0, 1, 3
  batch = jnp.repeat(tokens, len(points) + 1, 0)
  for row, p in enumerate(points, 1):
    batch = batch.at[row, p].set((tokens[0, p] + 5) % cfg.vocab_size)
  logits, _ = run_segments(forward, state, batch, compressive.init_memory(cfg, batch.shape[0]), t)
  logits = np.asarray(logits)
  for row, p in enumerate(points, 1):
    np.testing.assert_array_equal(logits[row, :p], logits[0, :p])
    assert np.abs(logits[row, p] - logits[0, p]).max() > 0


def test_rope_segment_by_segment_equals_whole_sequence():
  t, n_seg = 4, 5
  total = t * n_seg
  cfg = rope_config(num_layers=2, segment_length=t, memory_length=total, compressed_memory_length=0)
  state, forward = jitted_forward(make_model(cfg))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, total), 0, cfg.vocab_size)
  seg_logits, _ = run_segments(forward, state, tokens, compressive.init_memory(cfg, 2), t)
  whole, _, _ = forward(state, tokens, compressive.init_memory(cfg, 2), None)
  np.testing.assert_allclose(np.asarray(seg_logits), np.asarray(whole), rtol=1e-5, atol=1e-5)


def test_fused_output_equals_explicit_weights(monkeypatch):
  calls = []
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(
    jax.nn, "dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k)
  )
  cfg = rope_config(num_layers=2)
  model = make_model(cfg, seed=4)
  memory = explicit = compressive.init_memory(cfg, 2)
  rng = np.random.default_rng(0)
  for s in range(6):  # fills memory and compressed memory
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, cfg.segment_length)), jnp.int32)
    n = len(calls)
    got, memory, aux = model(tokens, memory)
    assert len(calls) == n + cfg.num_layers  # every layer ran fused
    want, explicit, aux_w = model(tokens, explicit, collect_attention=True)
    assert len(calls) == n + cfg.num_layers  # ... and not when weights are read
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"segment {s}")
    np.testing.assert_allclose(
      aux.reconstruction_loss, aux_w.reconstruction_loss, rtol=1e-5, atol=1e-7
    )
    # Fused: no weights, so no attention mass; explicit: it sums to one.
    assert all(
      np.isnan(aux.scalars()[f"attention_mass/{k}"])
      for k in ("compressed_memory", "memory", "segment")
    )
    assert sum(
      float(aux_w.scalars()[f"attention_mass/{k}"])
      for k in ("compressed_memory", "memory", "segment")
    ) == pytest.approx(1.0, abs=1e-5)
  # The same memory; only `usage` differs: it is accumulated from the
  # weights, so it stays zero when they are not computed (only most_used reads it).
  for name in ("mem", "cmem", "mem_mask", "cmem_mask"):
    np.testing.assert_allclose(getattr(memory, name), getattr(explicit, name), rtol=1e-5, atol=1e-6)
  assert not np.asarray(memory.usage).any()

  # Weights are computed where they are read: most-used usage, and attention
  # dropout (the fused call has none).
  n = len(calls)
  make_model(rope_config(compression="most_used"))(tokens, memory)
  dropping = make_model(rope_config(dropout_rate=0.5))
  a, _, _ = dropping(tokens, memory, dropout_rng=jax.random.PRNGKey(0))
  b, _, _ = dropping(tokens, memory, dropout_rng=jax.random.PRNGKey(1))
  assert len(calls) == n and not np.allclose(a, b)


def test_reconstruction_sees_unrotated_queries_and_keys():
  # §3.2's loss is content-only attention over plain projections, whatever
  # the position scheme: one layer (its inputs are the embeddings either way)
  # with the same weights gives the same loss with rope and relative positions.
  rope = make_model(rope_config(num_layers=1), seed=4)
  relative = make_model(tiny_model_config(num_layers=1), seed=5)

  def overlay(mine, theirs):  # theirs wherever they have it
    return (
      {
        k: overlay(v, theirs[k]) if isinstance(v, dict) else theirs.get(k, v)
        for k, v in mine.items()
      }
      if isinstance(theirs, dict)
      else theirs
    )

  state = nnx.state(relative)
  nnx.replace_by_pure_dict(
    state, overlay(nnx.to_pure_dict(state), nnx.to_pure_dict(nnx.state(rope)))
  )
  nnx.update(relative, state)
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 24), 0, 32)
  losses = []
  for model in (rope, relative):
    memory, recon = model.init_memory(2), []
    for s in range(0, 24, model.config.segment_length):
      _, memory, aux = model(tokens[:, s : s + model.config.segment_length], memory)
      recon.append(float(aux.reconstruction_loss))
    losses.append(recon)
  assert max(losses[0]) > 0
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5, atol=1e-7)


def test_rope_greedy_cached_decoding_equals_uncached():
  cfg = rope_config(num_layers=2)
  model = make_model(cfg, seed=3)
  prompt = [int(x) for x in jax.random.randint(jax.random.PRNGKey(0), (6,), 0, cfg.vocab_size)]
  n = 22  # crosses several segment boundaries and compressions (T = 4)
  want = greedy_without_cache(cfg, model, prompt, n)
  sampler = Sampler(model, batch_size=1)
  got = [int(tok[0]) for tok in sampler.generate(prompt, n, temperature=0.0)]
  assert got == want
  assert bool(sampler.memory.cmem_mask.any())


def test_resuming_with_other_positions_names_the_field(tmp_path):
  from compressive.configs import default, default_rope
  from compressive.training import runconfig

  runconfig.save_config(str(tmp_path), checked(default.get_config()))
  with pytest.raises(ConfigError, match=r"model.positions 'relative' -> 'rope'"):
    runconfig.check_resume_config(str(tmp_path), checked(default_rope.get_config()))


def test_attention_implementation_is_checked_before_anything_runs():
  with pytest.raises(
    ConfigError, match="attention_implementation='cudnn' needs model.positions='rope'"
  ):
    ModelConfig.from_config(tiny_model_config(attention_implementation="cudnn"))
  with pytest.raises(ConfigError, match="attention_implementation='flash' is unknown"):
    ModelConfig.from_config(rope_config(attention_implementation="flash"))
  # cuDNN on a machine without a GPU: one line at validation, not a trace
  # error from inside jax (aot.py passes num_devices and compiles for a GPU).
  from helpers import tiny_experiment

  config = tiny_experiment(**{"model.positions": "rope", "model.attention_implementation": "cudnn"})
  if jax.default_backend() != "gpu":
    with pytest.raises(ConfigError, match="needs a GPU"):
      config_lib.check(config)
  config_lib.check(config, num_devices=jax.device_count())


def test_xla_implementation_equals_the_default():
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 0, 32)
  outs = []
  for impl in ("auto", "xla"):
    model = make_model(rope_config(attention_implementation=impl), seed=4)
    memory = model.init_memory(2)
    outs.append(model(tokens[:, :4], memory)[0])
  np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))
