"""The task-taught compression (beyond the paper): `model.memory_gradient`
and the train step's `gradient_window`.

The promises, each a property that fails when the window is one segment off:
- within a window, the loss of segment j reaches the compression network as
  it compressed at every earlier segment t of the window whose compression
  holds real slots (t >= 1 here: segment 0 evicts an empty memory), and
  with "memories" the layers that wrote segment t's memory too; the loss of
  the window's first segment reaches nothing earlier, and nothing reaches
  back past the window (the step's windows are [0, W), [W, 2W), ...);
- "none" is the paper's: no loss reaches across segments at any window;
- a window of one segment is the paper's update, whatever the mode;
- chunked attention and scanned layers give the plain model's window loss
  and gradients; a windowed run resumes bit for bit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from compressive import config as config_lib
from compressive import experiment as experiment_lib
from compressive.errors import ConfigError
from compressive.model import memory as memory_lib
from compressive.model.transformer import merge_params
from compressive.training import step as train_step
from helpers import assert_stopped_and_resumed_like_straight, tiny_experiment, tiny_model_config

B, T = 2, 4


def model_config(mode, **overrides):
  """One layer whose memory holds exactly the last segment (M = T) and whose
  compressed memory holds the last four segments' compressions (8 slots at
  rate 2): a segment's compression is attended by the next four segments.
  No reconstruction loss: every gradient the compressor gets is the LM's."""
  values = dict(
    num_layers=1,
    segment_length=T,
    memory_length=T,
    compressed_memory_length=8,
    compression_rate=2,
    reconstruction_loss="none",
    memory_gradient=mode,
  )
  values.update(overrides)
  return tiny_model_config(**values)


def segments(n, mask_at=None, seed=1):
  """n segments of one document per row (it starts at segment 0); the loss
  counts segment `mask_at`'s tokens only (every segment's when None)."""
  tokens = jax.random.randint(jax.random.PRNGKey(seed), (n, B, T + 1), 0, 32)
  mask = np.zeros((n, B, T), bool)
  if mask_at is None:
    mask[:] = True
  else:
    mask[mask_at] = True
  sos = np.zeros((n, B), bool)
  sos[0] = True
  return {
    "inputs": tokens[..., :-1],
    "targets": tokens[..., 1:],
    "mask": jnp.asarray(mask),
    "start_of_sequence": jnp.asarray(sos),
  }


def norms_by_segment(grads, part):
  """|gradient| of the parameters whose path holds `part`, per segment copy."""
  leaves = [
    x
    for path, x in jax.tree_util.tree_leaves_with_path(grads)
    if any(getattr(k, "key", None) == part for k in path)
  ]
  assert leaves, part
  return np.sqrt(sum(np.square(np.asarray(x)).reshape(x.shape[0], -1).sum(-1) for x in leaves))


def reach(mode, window=4):
  """{part: bool [t, j]}: whether the loss of segment j of one window reaches
  the parameters of `part` as segment t used them. Every segment computes
  with its own copy of the parameters (equal values), so each copy's
  gradient is what reaches that segment's use of them."""
  cfg = model_config(mode)
  graphdef, template, params = train_step.build_model(cfg, 0)
  copies = jax.tree.map(lambda p: jnp.stack([p] * window), params)

  def forward(copies, seg, memory, rng):
    del rng
    model = merge_params(graphdef, template, jax.tree.map(lambda p: p[seg["index"]], copies))
    return train_step._forward(model, seg, memory, None)

  memory = memory_lib.init_memory(cfg, B)
  grad = jax.jit(
    jax.grad(
      lambda c, segs: train_step.window_loss(c, forward, segs, memory, jax.random.PRNGKey(0))[0]
    )
  )
  out = {"compressor": np.zeros((window, window), bool), "embed": np.zeros((window, window), bool)}
  for j in range(window):
    segs = dict(segments(window, mask_at=j), index=jnp.arange(window))
    grads = grad(copies, segs)
    for part in out:
      out[part][:, j] = norms_by_segment(grads, part) > 0
  return out


def test_within_a_window_the_loss_reaches_every_earlier_compression():
  t, j = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
  compressed_real_slots = t >= 1  # segment 0 evicted an empty memory
  for mode in ("compressor", "memories"):
    got = reach(mode)
    np.testing.assert_array_equal(got["compressor"], compressed_real_slots & (t < j), mode)
  # The layers that wrote the memory (here the embeddings, layer 0's inputs)
  # are reached across segments only with "memories".
  np.testing.assert_array_equal(reach("compressor")["embed"], t == j)
  np.testing.assert_array_equal(reach("memories")["embed"], t <= j)


def test_the_papers_setting_reaches_no_earlier_segment():
  got = reach("none")
  assert not got["compressor"].any()
  np.testing.assert_array_equal(got["embed"], np.eye(4, dtype=bool))


def compressor_learns_from(mode, window, steps=6):
  """The segments j (of `steps` per train step) whose loss alone, through
  one train step, changes the compressor (SGD: only a non-zero gradient
  moves a parameter)."""
  cfg = model_config(mode)
  graphdef, template, params = train_step.build_model(cfg, 0)
  tx = optax.sgd(1.0)
  step = train_step.make_train_step(graphdef, template, tx, False, gradient_window=window)
  before = [
    np.asarray(x)
    for path, x in jax.tree_util.tree_leaves_with_path(params)
    if "compressor" in jax.tree_util.keystr(path)
  ]
  learned = []
  for j in range(steps):
    fresh = jax.tree.map(jnp.array, params)  # the step donates its state
    state = train_step.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=fresh,
      opt_state=tx.init(fresh),
      rng=jax.random.PRNGKey(0),
    )
    state, _, metrics = step(state, memory_lib.init_memory(cfg, B), segments(steps, mask_at=j))
    assert np.asarray(metrics["tokens"]).shape == (steps,)
    after = [
      np.asarray(x)
      for path, x in jax.tree_util.tree_leaves_with_path(state.params)
      if "compressor" in jax.tree_util.keystr(path)
    ]
    if any(not np.array_equal(a, b) for a, b in zip(before, after)):
      learned.append(j)
  return learned


@pytest.mark.parametrize(
  "mode,window,want",
  [
    # Windows [0, 3) and [3, 6): segment 3 opens the second window, so the
    # compressions of segments 1-2 are out of its reach and its own comes
    # after its queries.
    ("compressor", 3, [2, 4, 5]),
    ("compressor", 2, [3, 5]),  # windows [0, 2), [2, 4), [4, 6)
    ("memories", 6, [2, 3, 4, 5]),  # one window
    ("compressor", 1, []),  # one segment per update: the paper's reach
    ("none", 3, []),
  ],
)
def test_the_step_cuts_the_gradient_at_each_window(mode, window, want):
  assert compressor_learns_from(mode, window) == want


def trained(mode, window, steps=3, **overrides):
  cfg = model_config(mode, reconstruction_loss="attention", **overrides)
  graphdef, template, params = train_step.build_model(cfg, 0)
  tx = optax.sgd(0.1)
  step = train_step.make_train_step(graphdef, template, tx, False, gradient_window=window)
  state = train_step.TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.PRNGKey(0),
  )
  memory = memory_lib.init_memory(cfg, B)
  for s in range(steps):
    state, memory, metrics = step(state, memory, segments(4, seed=s))
  return jax.device_get((state.params, memory, metrics))


def test_a_window_of_one_segment_is_the_papers_update_in_every_mode():
  # Measured: bit-identical parameters, memory and metrics at XLA's levels 0
  # and 3; the tolerance leaves room for another XLA's fusion choices.
  want = trained("none", 1)
  for mode in ("compressor", "memories"):
    got = trained(mode, 1)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


# Chunked attention and scanned layers reorder no sum that matters here:
# measured largest differences (float32, matmuls at "highest" as conftest
# sets, XLA's CPU backend at optimisation levels 0 and 3): loss 0, gradients
# 2.2e-8 / 3.0e-8 (chunked) and 1.5e-8 / 2.6e-8 (scanned). The tolerance is
# the scanned-layers tests' (tests/model/test_scan_layers.py), 170x the largest.
TOLERANCE = 5e-6


def window_loss_and_grads(cfg, params=None, window=4):
  graphdef, template, own = train_step.build_model(cfg, 0)
  params = own if params is None else params

  def forward(params, seg, memory, rng):
    del rng
    return train_step._forward(merge_params(graphdef, template, params), seg, memory, None)

  memory = memory_lib.init_memory(cfg, B)
  return jax.jit(
    jax.value_and_grad(
      lambda p: train_step.window_loss(p, forward, segments(window), memory, jax.random.PRNGKey(0))[
        0
      ]
    )
  )(params)


def stack_layers(params):
  blocks = params["blocks"]
  return dict(
    params, blocks=jax.tree.map(lambda *a: jnp.stack(a), *[blocks[i] for i in sorted(blocks)])
  )


@pytest.mark.slow  # compiles the window's gradient three times
def test_chunked_and_scanned_windows_equal_the_plain_one():
  # "memories": every path a window's gradient takes (through the compressed
  # slots, the stored slots and the layers that wrote them).
  mode, base = "memories", dict(num_layers=2, reconstruction_loss="attention")
  loss, grads = window_loss_and_grads(model_config(mode, **base))
  assert np.isfinite(loss)
  chunked_loss, chunked = window_loss_and_grads(model_config(mode, attention_chunk_size=2, **base))
  _, _, params = train_step.build_model(model_config(mode, **base), 0)
  scanned_loss, scanned = window_loss_and_grads(
    model_config(mode, scan_layers=True, **base), stack_layers(params)
  )
  for got_loss, got, want in (
    (chunked_loss, chunked, grads),
    (scanned_loss, scanned, stack_layers(grads)),
  ):
    np.testing.assert_allclose(got_loss, loss, rtol=TOLERANCE)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(
        np.asarray(x),
        np.asarray(y),
        atol=TOLERANCE,
        rtol=TOLERANCE,
        err_msg=jax.tree_util.keystr(path),
      )


@pytest.mark.slow
def test_a_windowed_run_resumes_bit_for_bit(tmp_path):
  config = tiny_experiment(
    **{
      "segments_per_step": 4,
      "gradient_window": 2,
      "model.memory_gradient": "memories",
      "num_train_steps": 6,
      "checkpoint_every_steps": 3,
      "eval_every_steps": 0,
      "model.dropout_rate": 0.1,
    }
  )
  assert assert_stopped_and_resumed_like_straight(config, tmp_path, 3, 4) == [2, 4, 6]


def test_the_schedule_counts_one_update_per_window():
  config = tiny_experiment(
    **{
      "segments_per_step": 4,
      "gradient_window": 2,
      "model.memory_gradient": "compressor",
      "num_train_steps": 10,
      "optimizer.warmup_steps": 3,
    }
  )
  train = experiment_lib.TrainConfig.from_dict(config, config.model.segment_length)
  assert (train.updates_per_step, train.num_updates) == (2, 20)
  schedule = train_step.learning_rate_schedule(train)
  peak = config.optimizer.learning_rate
  assert float(schedule(5)) < peak and float(schedule(6)) == pytest.approx(peak)


@pytest.mark.parametrize(
  "overrides,fragment",
  [
    ({"gradient_window": 3}, "segments_per_step=2 is not a multiple of gradient_window=3"),
    ({"gradient_window": 0}, "gradient_window=0 must be a positive integer"),
    ({"gradient_window": -2}, "gradient_window=-2 must be a positive integer"),
    ({"gradient_window": 2, "grad_accum_steps": 2}, "set one of them to 1"),
    ({"model.memory_gradient": "all"}, "model.memory_gradient='all' is unknown"),
    (
      {"model.memory_gradient": "compressor", "model.compressed_memory_length": 0},
      "needs a compressed memory",
    ),
  ],
)
def test_bad_windows_and_modes_are_one_line(overrides, fragment):
  with pytest.raises(ConfigError) as e:
    config_lib.check(tiny_experiment(**overrides))
  assert fragment in str(e.value)
  assert "\n" not in str(e.value)
