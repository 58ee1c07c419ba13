"""Where the model follows the paper's Algorithm 1 and §3 (docs/PAPER.md,
"The paper and this implementation"): post-norm layers, the compressors'
initialisation and receptive field, and no training-only work outside
training."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model.compression import COMPRESSIONS
from helpers import make_model, tiny_model_config


def run_segments(model, cfg, n, batch=2, seed=0):
  tokens = jax.random.randint(
    jax.random.PRNGKey(seed), (batch, n * cfg.segment_length), 0, cfg.vocab_size
  )
  memory, out = compressive.init_memory(cfg, batch), []
  t = cfg.segment_length
  for s in range(n):
    out.append(model(tokens[:, s * t : (s + 1) * t], memory))
    memory = out[-1][1]
  return out


# -- Post-norm (Alg. 1: a = LN(attn + h), h' = LN(mlp(a) + a)). ----------------


def test_post_norm_memory_above_the_first_layer_holds_layer_norm_outputs():
  cfg = tiny_model_config(norm="post", num_layers=3, d_model=32, memory_length=8)
  model = make_model(cfg)
  _, memory, _ = run_segments(model, cfg, 2)[-1]
  for layer in range(cfg.num_layers):
    slots = np.asarray(memory.mem[layer])  # [B, M, d], all valid after two segments
    assert np.asarray(memory.mem_mask[layer]).all()
    mean, std = slots.mean(-1), slots.std(-1)
    if layer == 0:  # the embeddings (N(0, 1) entries): not normalised per slot
      assert np.abs(mean).max() > 0.05
    else:  # LN outputs with scale 1, bias 0 at initialisation
      np.testing.assert_allclose(mean, 0.0, atol=1e-5)
      np.testing.assert_allclose(std, 1.0, rtol=1e-4)


def test_post_norm_has_no_layer_norm_inside_the_attention_nor_a_final_one():
  post = make_model(tiny_model_config(norm="post"))
  pre = make_model(tiny_model_config(norm="pre"))
  assert post.final_norm is None and pre.final_norm is not None
  for block in post.blocks:
    assert block.attention.norm is None and block.attention_norm is not None
  for block in pre.blocks:
    assert block.attention.norm is not None and block.attention_norm is None
  count = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  assert count(post) == count(pre) - 2 * 16  # the final LN's scale and bias


def test_post_norm_matches_a_hand_written_layer():
  cfg = tiny_model_config(norm="post", num_layers=1, compressed_memory_length=0, memory_length=0)
  model = make_model(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, cfg.segment_length), 0, cfg.vocab_size)
  logits, _, _ = model(tokens, compressive.init_memory(cfg, 2))
  block = model.blocks[0]
  x = model.embed(tokens)
  att = block.attention
  k, v = att.keys_values(x)
  r = att.position_keys(
    compressive.model.attention.sinusoids(np.arange(cfg.segment_length - 1, -1, -1), cfg.d_model)
  )
  a, _ = att(att.query(x), k, v, jnp.ones(tokens.shape, bool), cfg.segment_length - 1, r)
  ln = lambda y: (y - y.mean(-1, keepdims=True)) / jnp.sqrt(y.var(-1, keepdims=True) + 1e-6)
  h = ln(x + a)
  out = ln(h + block.ffn(h))
  np.testing.assert_allclose(logits, out @ model.head[...], rtol=2e-5, atol=2e-5)


# -- The compressors. ------------------------------------------------------------


def test_conv_starts_as_mean_pooling_with_small_noise_at_paper_width():
  d, c = 1024, 3
  conv = COMPRESSIONS["conv"](c, d, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 64 * c, d))
  mask = jnp.ones(x.shape[:2], bool)
  out, _ = conv(x, mask, None)
  mean, _ = COMPRESSIONS["mean_pool"](c, d, rngs=None)(x, mask, None)
  ratio = float(jnp.linalg.norm(out - mean) / jnp.linalg.norm(mean))
  assert ratio < 0.05, ratio  # N(0, 0.02^2) noise gave 1.9
  assert ratio > 0.005, ratio  # and some noise there is


@pytest.mark.parametrize("rate", [2, 3, 4, 5, 6, 8])
def test_dilated_conv_stays_inside_each_group(rate):
  d, groups = 8, 3
  conv = COMPRESSIONS["dilated_conv"](rate, d, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (1, groups * rate, d))
  mask = jnp.ones(x.shape[:2], bool)
  out = np.asarray(conv(x, mask, None)[0])
  for slot in range(groups * rate):
    bumped = np.asarray(conv(x.at[0, slot].add(1.0), mask, None)[0])
    changed = [g for g in range(groups) if not np.array_equal(bumped[0, g], out[0, g])]
    assert changed == [slot // rate], (slot, changed)  # its own group's slot, and only it


# -- No training-only work outside training. -------------------------------------


def test_evaluation_mode_computes_no_reconstruction_loss_and_the_same_outputs():
  cfg = tiny_model_config()
  model = make_model(cfg)
  train = run_segments(model, cfg, 4)
  assert float(train[-1][2].reconstruction_loss) > 0  # evictions happened
  model.eval()
  evaluated = run_segments(model, cfg, 4)
  for (lt, mt, _), (le, me, ae) in zip(train, evaluated):
    assert float(ae.reconstruction_loss) == 0.0
    np.testing.assert_array_equal(lt, le)
    jax.tree.map(np.testing.assert_array_equal, mt, me)


def test_evaluation_mode_traces_no_reconstruction_attention():
  cfg = tiny_model_config(num_layers=1)
  model = make_model(cfg)
  memory = run_segments(model, cfg, 3)[-1][1]
  tokens = jnp.zeros((2, cfg.segment_length), jnp.int32)
  graphdef, state = nnx.split(model)
  count = lambda: str(
    jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(tokens, memory)[0])(state)
  ).count("exp")
  in_training = count()
  model.eval()
  graphdef, state = nnx.split(model)
  # The reconstruction loss's two content attentions each take a softmax.
  assert count() < in_training


@pytest.mark.parametrize("compression", ["max_pool", "overlap_max_pool", "mean_pool", "most_used"])
@pytest.mark.parametrize("loss", ["attention", "autoencoding"])
def test_parameter_free_compressions_have_no_reconstruction_loss(compression, loss):
  cfg = tiny_model_config(compression=compression, reconstruction_loss=loss)
  model = make_model(cfg)
  out = run_segments(model, cfg, 4)
  assert all(float(aux.reconstruction_loss) == 0.0 for _, _, aux in out)
  assert not [k for k, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)) if "compressor" in k]


def _count(jaxpr, primitive: str) -> int:
  """Equations of `primitive` in a jaxpr and every jaxpr nested in it."""
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == primitive
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        # JAX 0.11 makes ClosedJaxpr an alias of Jaxpr: test Jaxpr first.
        if isinstance(sub, jax.extend.core.Jaxpr):
          n += _count(sub, primitive)
        elif isinstance(sub, jax.extend.core.ClosedJaxpr):
          n += _count(sub.jaxpr, primitive)
  return n


def test_streaming_evaluation_computes_position_keys_once_per_stream():
  from compressive.evaluation import evaluate as eval_lib

  cfg = tiny_model_config(num_layers=3)
  model = make_model(cfg)
  model.eval()
  b, t = 2, cfg.segment_length
  init, step = eval_lib.make_stream_step(model)
  memory = model.init_memory(b)
  carry = init(memory)
  np.testing.assert_array_equal(carry.position_keys, model.position_keys(memory, t))
  tokens = np.zeros((b, t), np.int32)
  batch = dict(
    inputs=tokens, targets=tokens, mask=np.ones((b, t), bool), start_of_sequence=np.ones((b,), bool)
  )
  dots = lambda c: _count(jax.make_jaxpr(step)(c, batch).jaxpr, "dot_general")
  # Without the carried keys every layer would project its sinusoids itself.
  assert dots(carry.replace(position_keys=None)) - dots(carry) == cfg.num_layers
  _, out = step(carry, batch)
  assert float(out["count"]) == b * t
