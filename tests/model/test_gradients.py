"""Which parameters each loss reaches (paper §3.2).

The language-model loss must never train the compression network; the
reconstruction loss must train nothing but it. The memory layers' key and
value projections must keep learning from the LM loss through the memory
(the most used PyTorch implementation silently freezes them).
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model import losses
from helpers import tiny_model_config


def loss_grads(cfg, n_before=3):
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  t = cfg.segment_length
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, (n_before + 1) * t + 1), 0, cfg.vocab_size)
  memory = compressive.init_memory(cfg, 2)
  forward = jax.jit(lambda p, x, mem: nnx.merge(graphdef, p, rest)(x, mem))
  for s in range(n_before):  # fill memory so that the next segment evicts
    _, memory, _ = forward(params, tokens[:, s * t : (s + 1) * t], memory)
  seg = tokens[:, n_before * t : (n_before + 1) * t]
  targets = tokens[:, n_before * t + 1 : (n_before + 1) * t + 1]

  def losses_of(params):
    logits, _, aux = nnx.merge(graphdef, params, rest)(seg, memory)
    nats, count = losses.cross_entropy(logits, targets)
    return nats / count, aux.reconstruction_loss

  lm = jax.jit(jax.grad(lambda p: losses_of(p)[0]))(params)
  rec = jax.jit(jax.grad(lambda p: losses_of(p)[1]))(params)
  flat = lambda g: {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(g)}
  return flat(lm), flat(rec), float(losses_of(params)[1])


@pytest.mark.parametrize(
  "compression,loss,norm",
  [
    ("conv", "attention", "pre"),
    ("dilated_conv", "attention", "pre"),
    ("conv", "autoencoding", "pre"),
    ("dilated_conv", "autoencoding", "pre"),
    ("conv", "attention", "post"),
    ("conv", "attention", "own"),
    ("conv", "autoencoding", "own"),
  ],
)
def test_each_loss_reaches_only_its_parameters(compression, loss, norm):
  # "own": pre-norm with the compressed slots' own projections
  # (model.compressed_keys_values), read by the reconstruction loss frozen.
  own = norm == "own"
  cfg = tiny_model_config(
    compression=compression,
    reconstruction_loss=loss,
    norm="pre" if own else norm,
    compressed_keys_values="own" if own else "shared",
  )
  lm, rec, rec_value = loss_grads(cfg)
  assert rec_value > 0  # an eviction happened
  compressor = [k for k in lm if "compressor" in k]
  others = [k for k in lm if "compressor" not in k]
  assert compressor and others
  for k in compressor:
    assert np.all(lm[k] == 0.0), f"LM loss reached compressor parameter {k}"
    assert np.any(rec[k] != 0.0), f"reconstruction loss does not train {k}"
  for k in others:
    assert np.all(rec[k] == 0.0), f"reconstruction loss reached {k}"
  own_projections = [k for k in lm if k.rsplit("/", 1)[-1] in ("wkc", "wvc")]
  assert len(own_projections) == (2 * cfg.num_layers if own else 0), own_projections
  for k in own_projections:  # the LM loss trains them, through the compressed slots
    assert np.any(lm[k] != 0.0), f"LM loss does not train {k}"


def test_lm_loss_trains_memory_key_value_projections_in_every_layer():
  cfg = tiny_model_config(num_layers=3)
  lm, _, _ = loss_grads(cfg)
  for layer in range(3):
    for name in ("wk", "wv", "wr", "u", "v", "wq", "wo"):
      key = f"blocks/{layer}/attention/{name}"
      assert np.any(lm[key] != 0.0), f"{key} gets no LM gradient"


def test_memory_key_value_gradient_flows_through_the_memory():
  # Same segment, empty vs full memory: the k/v gradient differs, so the
  # memory's keys and values are differentiated, not frozen.
  cfg = tiny_model_config(num_layers=1, compressed_memory_length=0)
  with_memory, _, _ = loss_grads(cfg, n_before=2)
  without, _, _ = loss_grads(cfg, n_before=0)
  assert not np.allclose(with_memory["blocks/0/attention/wk"], without["blocks/0/attention/wk"])


def test_memories_are_stop_gradient_between_segments():
  cfg = tiny_model_config()
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  t = cfg.segment_length
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 2 * t + 1), 0, cfg.vocab_size)

  def second_segment_loss(params, memory=None):
    m = nnx.merge(graphdef, params, rest)
    if memory is None:  # the first segment runs inside the differentiated function
      _, memory, _ = m(tokens[:, :t], compressive.init_memory(cfg, 2))
    logits, _, _ = m(tokens[:, t : 2 * t], memory)
    nats, count = losses.cross_entropy(logits, tokens[:, t + 1 : 2 * t + 1])
    return nats / count

  _, memory, _ = model(tokens[:, :t], compressive.init_memory(cfg, 2))
  through = jax.jit(jax.grad(second_segment_loss))(params)
  outside = jax.jit(jax.grad(second_segment_loss))(params, memory)
  for a, b in zip(jax.tree.leaves(through), jax.tree.leaves(outside)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_no_eviction_means_zero_reconstruction_loss():
  cfg = tiny_model_config()
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0))
  _, _, aux = model(jnp.ones((1, 4), jnp.int32), compressive.init_memory(cfg, 1))
  assert float(aux.reconstruction_loss) == 0.0
