"""Scanned layers and rematerialisation compute what the unrolled model does.

`model.scan_layers` stacks every layer's parameters along a leading layer axis
and runs one `lax.scan` over it and the memory's layer axis; `model.remat`
recomputes each layer's forward pass in the backward pass. Neither may change
a value: same logits, memory, aux and gradients as the unrolled model with the
same weights, in training (dropout too), cached evaluation and decoding.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model import losses
from compressive.model.sampling import Sampler
from compressive.scale import sharding
from helpers import tiny_model_config

# Every test compiles the deep model's step (forward and gradients) twice or
# more: the slow tier.
pytestmark = pytest.mark.slow

# Scan and remat reorder nothing inside a layer, so float32 agreement is at
# rounding level. Measured on this machine, largest differences over every
# case below: logits 4.8e-7 (with dropout; 0 without), memory 0, gradients
# 9e-8. The tolerances are ten times the largest.
ATOL = RTOL = 5e-6


def stacked(params):
  """Unrolled parameters (blocks/0, blocks/1, ...) in the scanned layout."""
  blocks = params["blocks"]
  out = dict(params)
  out["blocks"] = jax.tree.map(lambda *a: jnp.stack(a), *[blocks[i] for i in sorted(blocks)])
  return out


def pure_params(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def run(cfg, params_of=None, segments=4, dropout=False, seed=0):
  """(logits per segment, final memory, aux per segment, gradients of the
  last segment's LM + reconstruction loss) of a model of `cfg`."""
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(seed))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  if params_of is not None:
    nnx.replace_by_pure_dict(params, params_of)
  b, t = 2, cfg.segment_length
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, segments * t + 1), 0, cfg.vocab_size)
  memory = compressive.init_memory(cfg, b)
  rng = jax.random.PRNGKey(2) if dropout else None

  def loss(params, seg, targets, memory, sos):
    logits, new_memory, aux = nnx.merge(graphdef, params, rest)(seg, memory, sos, dropout_rng=rng)
    nats, count = losses.cross_entropy(logits, targets)
    return nats / count + aux.reconstruction_loss, (logits, new_memory, aux)

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  outs = []
  for s in range(segments):
    seg, targets = tokens[:, s * t : (s + 1) * t], tokens[:, s * t + 1 : (s + 1) * t + 1]
    sos = jnp.asarray([s == 0, s in (0, 2)])  # row 1 restarts mid-stream
    (_, (logits, memory, aux)), grads = step(params, seg, targets, memory, sos)
    outs.append((logits, aux))
  return outs, memory, nnx.to_pure_dict(grads)


def assert_close(a, b, what):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(
      np.asarray(x),
      np.asarray(y),
      atol=ATOL,
      rtol=RTOL,
      err_msg=f"{what} {jax.tree_util.keystr(path)}",
    )


def test_scanned_layers_initialise_to_the_unrolled_weights():
  cfg = tiny_model_config(num_layers=3)
  unrolled = pure_params(compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0)))
  scanned = pure_params(
    compressive.CompressiveTransformer(
      tiny_model_config(num_layers=3, scan_layers=True), rngs=nnx.Rngs(0)
    )
  )
  assert scanned["blocks"]["attention"]["wq"].shape[0] == 3
  assert_close(scanned, stacked(unrolled), "initial parameter")


@pytest.mark.parametrize(
  "overrides",
  [
    dict(),
    dict(positions="rope", compression="most_used"),
    dict(compression="dilated_conv", reconstruction_loss="autoencoding"),
    dict(compression="overlap_max_pool"),
    dict(compressed_keys_values="own"),
    dict(dropout_rate=0.2),
  ],
)
def test_scanned_equals_unrolled_in_values_and_gradients(overrides):
  cfg = tiny_model_config(num_layers=3, **overrides)
  dropout = cfg.dropout_rate > 0
  unrolled = pure_params(compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(3)))
  want, want_memory, want_grads = run(cfg, dropout=dropout, seed=3)
  got, got_memory, got_grads = run(
    tiny_model_config(num_layers=3, scan_layers=True, **overrides),
    params_of=stacked(unrolled),
    dropout=dropout,
    seed=3,
  )
  for s, ((lw, aw), (lg, ag)) in enumerate(zip(want, got)):
    assert_close(lg, lw, f"segment {s} logits")
    assert_close(ag, aw, f"segment {s} aux")
  assert_close(got_memory, want_memory, "memory")
  assert_close(got_grads, stacked(want_grads), "gradient")
  assert np.asarray(want_memory.cmem_mask).any()  # the compressor was exercised
  if overrides.get("compression") not in ("most_used", "overlap_max_pool"):  # no parameters
    assert np.any(np.asarray(want[-1][1].reconstruction_loss) > 0)


@pytest.mark.parametrize("scan,remat", [(False, "full"), (True, "matmuls"), (True, "full")])
def test_remat_changes_no_value_or_gradient(scan, remat):
  cfg = tiny_model_config(num_layers=2, scan_layers=scan, dropout_rate=0.1)
  want, want_memory, want_grads = run(cfg, dropout=True)
  got, got_memory, got_grads = run(
    tiny_model_config(num_layers=2, scan_layers=scan, dropout_rate=0.1, remat=remat), dropout=True
  )
  for (lw, _), (lg, _) in zip(want, got):
    assert_close(lg, lw, "logits")
  assert_close(got_memory, want_memory, "memory")
  assert_close(got_grads, want_grads, "gradient")


def test_remat_keeps_less_for_the_backward_pass():
  # What remat is for: the compiled forward+backward of the scanned layers
  # holds fewer temporaries. (Measured on this CPU, MiB: none 64, matmuls 23,
  # full 11. XLA:CPU does not shrink the unrolled model's, 35 -> 38: its
  # buffer assignment keeps the recomputed values alive alongside.)
  def temp_bytes(remat):
    cfg = tiny_model_config(
      num_layers=4,
      d_model=64,
      d_ff=256,
      segment_length=64,
      memory_length=64,
      compressed_memory_length=32,
      remat=remat,
      scan_layers=True,
    )
    model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    memory = compressive.init_memory(cfg, 16)
    tokens = jnp.zeros((16, cfg.segment_length), jnp.int32)

    def loss(params):
      logits, _, aux = nnx.merge(graphdef, params, rest)(tokens, memory)
      return logits.mean() + aux.reconstruction_loss

    compiled = jax.jit(jax.grad(loss)).lower(params).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  none, matmuls, full = temp_bytes("none"), temp_bytes("matmuls"), temp_bytes("full")
  assert full < matmuls < none, (none, matmuls, full)
  assert full < none / 2, (none, full)


def test_scanned_cached_evaluation_and_decoding_equal_unrolled():
  cfg = tiny_model_config(num_layers=3, compression="most_used")
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(5))
  scanned = compressive.CompressiveTransformer(
    tiny_model_config(num_layers=3, compression="most_used", scan_layers=True), rngs=nnx.Rngs(5)
  )
  for m in (model, scanned):
    m.eval()
  rng = np.random.default_rng(0)
  b, t = 2, cfg.segment_length
  plain = model.init_memory(b)
  cached = scanned.cache_keys_values(scanned.init_memory(b))
  for s in range(6):
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, t)), jnp.int32)
    sos = jnp.asarray([s == 0, s in (0, 3)])
    want, plain, _ = model(tokens, plain, sos)
    got, cached, _ = scanned(tokens, cached, sos)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=f"segment {s}")
  # Greedy decoding through the cache, scanned against unrolled.
  prompt = rng.integers(0, cfg.vocab_size, 3 * t + 1)
  texts = [
    np.stack(list(Sampler(m, 1).generate(prompt, 2 * t + 1, temperature=0.0)))
    for m in (model, scanned)
  ]
  np.testing.assert_array_equal(texts[1], texts[0])


def test_scanned_parameters_have_a_leading_layers_axis():
  cfg = tiny_model_config(num_layers=3, scan_layers=True)
  model = nnx.eval_shape(
    lambda: compressive.CompressiveTransformer(
      compressive.ModelConfig.from_config(cfg), rngs=nnx.Rngs(0)
    )
  )
  table = sharding.logical_axes(nnx.state(model))
  blocks = {k: v for k, v in table.items() if k.startswith("blocks/")}
  assert blocks and all(axes[0] == "layers" for axes in blocks.values())
  assert table["blocks/attention/wq"] == ("layers", "embed", "heads", "head_dim")
  assert all(axes[0] != "layers" for k, axes in table.items() if not k.startswith("blocks/"))
