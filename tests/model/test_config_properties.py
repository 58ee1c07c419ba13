"""Property tests for model-config validation (hypothesis).

For random configs, validation must accept exactly the consistent ones, and
reject every inconsistent one with one line naming an offending field; an
accepted config must build and run a segment.
"""

import math

from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive import config as config_lib
from compressive.errors import ConfigError
from compressive.model.compression import COMPRESSIONS
from compressive.model.config import ModelConfig
from helpers import jitted_forward

FIELDS = dict(
  vocab_size=st.integers(-2, 40),
  num_layers=st.integers(-1, 3),
  num_heads=st.integers(-1, 5),
  d_model=st.integers(-4, 24),
  d_ff=st.integers(-1, 16),
  segment_length=st.integers(-2, 12),
  memory_length=st.integers(-3, 12),
  compressed_memory_length=st.integers(-3, 8),
  compression_rate=st.integers(-1, 4),
  compression=st.sampled_from(tuple(COMPRESSIONS) + ("avg_pool",)),
  reconstruction_loss=st.sampled_from(("attention", "autoencoding", "none", "l1")),
  dropout_rate=st.sampled_from((0.0, 0.1, 1.0, -0.5)),
  dtype=st.sampled_from(("float32", "bfloat16", "float16")),
)


def expected_problems(v):
  """Independent statement of the rules: the fields that make `v` invalid."""
  bad = set()
  for name in (
    "vocab_size",
    "num_layers",
    "num_heads",
    "d_model",
    "d_ff",
    "segment_length",
    "compression_rate",
  ):
    if v[name] < 1:
      bad.add(name)
  for name in ("memory_length", "compressed_memory_length"):
    if v[name] < 0:
      bad.add(name)
  if v["num_heads"] >= 1 and v["d_model"] >= 1 and v["d_model"] % v["num_heads"]:
    bad.add("d_model")
  if v["compression"] not in COMPRESSIONS:
    bad.add("compression")
  if v["reconstruction_loss"] not in ("attention", "autoencoding", "none"):
    bad.add("reconstruction_loss")
  if not 0.0 <= v["dropout_rate"] < 1.0:
    bad.add("dropout_rate")
  if v["dtype"] not in ("float32", "bfloat16"):
    bad.add("dtype")
  if v["compressed_memory_length"] > 0 and v["memory_length"] == 0:
    bad.add("compressed_memory_length")
  if (
    v["compressed_memory_length"] > 0
    and v["compression_rate"] >= 1
    and v["segment_length"] >= 1
    and v["segment_length"] % v["compression_rate"]
  ):
    bad.add("segment_length")
  return bad


def validate_model(values):
  """The model section's checks as the experiment's check makes them: the
  fields (ModelConfig), then its plugins' names against their registries,
  which own them (a compression's name is looked up even where no memory is
  compressed: a typo there would surface only once compressed memory is
  turned on)."""
  config_lib._check_plugins(ModelConfig.from_config(values))


def test_an_unknown_compression_is_refused_where_nothing_is_compressed():
  # The case the property test below once drew by chance: every field
  # consistent, no compressed memory, an unknown compression's name.
  values = {
    "vocab_size": 1,
    "num_layers": 1,
    "num_heads": 1,
    "d_model": 1,
    "d_ff": 1,
    "segment_length": 1,
    "memory_length": 0,
    "compressed_memory_length": 0,
    "compression_rate": 1,
    "compression": "avg_pool",
    "reconstruction_loss": "attention",
    "dropout_rate": 0.0,
    "dtype": "float32",
  }
  ModelConfig.from_config(values)  # the fields alone are consistent
  with pytest.raises(ConfigError, match=r"^model.compression='avg_pool' is unknown"):
    validate_model(values)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries(FIELDS))
def test_validation_accepts_exactly_the_consistent_configs(values):
  assert_rejects_exactly(
    lambda: validate_model(values),
    expected_problems(values),
    lambda message: {f for f in FIELDS if f"model.{f}=" in message or f"model.{f} " in message},
  )


def assert_rejects_exactly(validate, bad, named):
  """`validate()` raises a one-line ConfigError naming one of `bad` (the
  fields `named(message)` finds) when `bad` is not empty, and passes when it is."""
  try:
    validate()
  except ConfigError as e:
    message = str(e)
    assert bad, f"rejected a consistent config: {message}"
    assert "\n" not in message
    assert named(message) & bad, f"{message!r} names none of {bad}"
  else:
    assert not bad, f"accepted an inconsistent config: {bad}"


@pytest.mark.slow  # builds and runs a model for every example
@settings(max_examples=5, deadline=None)
@given(
  st.fixed_dictionaries(
    dict(
      FIELDS,
      vocab_size=st.integers(1, 20),
      num_layers=st.integers(1, 2),
      num_heads=st.integers(1, 2),
      d_model=st.sampled_from((4, 8)),
      d_ff=st.integers(1, 8),
      segment_length=st.sampled_from((2, 4)),
      memory_length=st.integers(0, 5),
      compressed_memory_length=st.integers(0, 3),
      compression_rate=st.sampled_from((1, 2)),
      compression=st.sampled_from(tuple(COMPRESSIONS)),
      reconstruction_loss=st.sampled_from(("attention", "autoencoding", "none")),
      dropout_rate=st.just(0.0),
      dtype=st.just("float32"),
    )
  )
)
def test_accepted_configs_build_and_run(values):
  if expected_problems(values):
    return
  cfg = ModelConfig.from_config(values)
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0))
  memory = compressive.init_memory(cfg, 1)
  tokens = jnp.zeros((1, values["segment_length"]), jnp.int32)
  # Run jitted, as training and evaluation run it: one program per example
  # (op-by-op, each example's new shapes compiled some hundred small ones).
  state, forward = jitted_forward(model)
  for _ in range(2):
    logits, memory, _ = forward(state, tokens, memory, None)
  assert logits.shape == (1, values["segment_length"], values["vocab_size"])


# -- Training and optimizer fields. ---------------------------------------------------

# With float32's edges: overflow (1e39), underflow to 0 and to a subnormal,
# and a value that rounds onto 1.0.
NUMBERS = st.one_of(
  st.floats(allow_nan=True, allow_infinity=True),
  st.integers(-3, 3),
  st.sampled_from((0.0, 1.0, 0.5, 1e-9, 1e39, -1e39, 1e-300, 1e-41, 0.9999999999, 3.4e38)),
)
TRAINING_FIELDS = dict(
  batch_size=st.integers(-1, 3),
  num_train_steps=st.integers(-1, 3),
  segments_per_step=st.integers(-1, 3),
  log_every_steps=st.integers(-1, 3),
  keep_checkpoints=st.integers(-2, 3),
  eval_every_steps=st.integers(-2, 3),
  checkpoint_every_steps=st.integers(-2, 3),
)
OPTIMIZER_FIELDS = dict(
  learning_rate=NUMBERS,
  final_lr_fraction=NUMBERS,
  b1=NUMBERS,
  b2=NUMBERS,
  eps=NUMBERS,
  weight_decay=NUMBERS,
  grad_clip_norm=NUMBERS,
  warmup_steps=st.integers(-2, 3),
)


def expected_training_problems(v, o):
  """Independent statement of the ranges: the fields that make (v, o) invalid."""
  bad = {
    k
    for k in (
      "batch_size",
      "num_train_steps",
      "segments_per_step",
      "log_every_steps",
      "keep_checkpoints",
    )
    if v[k] < 1
  }
  bad |= {k for k in ("eval_every_steps", "checkpoint_every_steps") if v[k] < 0}
  inside = {  # open/closed bounds, written out
    "learning_rate": lambda x: x > 0 and x != math.inf,
    "final_lr_fraction": lambda x: 0 <= x <= 1,
    "b1": lambda x: 0 <= x < 1,
    "b2": lambda x: 0 <= x < 1,
    "eps": lambda x: x > 0 and x != math.inf,
    "weight_decay": lambda x: x >= 0 and x != math.inf,
    "grad_clip_norm": lambda x: x > 0,
  }
  held = {k: float32_held(o[k]) for k in inside}  # None: NaN, overflow or underflow
  bad |= {f"optimizer.{k}" for k, ok in inside.items() if held[k] is None or not ok(held[k])}
  # The products the update computes, in float32 too (when both are good).
  for other in ("final_lr_fraction", "weight_decay"):
    if {"optimizer.learning_rate", f"optimizer.{other}"} & bad or not held[other]:
      continue
    product = float32_held(float(f"{held['learning_rate'] * held[other]:.6g}"))
    if product is None or not 0 < product < math.inf:
      bad.add(f"optimizer.learning_rate x optimizer.{other}")
  if o["warmup_steps"] < 0:
    bad.add("optimizer.warmup_steps")
  return bad


def float32_held(x: float):
  """x as float32 holds it on the device; None when that is not x: NaN, a
  finite x that overflows to inf, or a nonzero x that underflows to 0 or a
  subnormal (accelerators flush those to 0)."""
  if math.isnan(x):
    return None
  with np.errstate(over="ignore", under="ignore"):
    held = float(np.float32(x))
  if (math.isinf(held) and not math.isinf(x)) or (x != 0 and abs(held) < np.finfo(np.float32).tiny):
    return None
  return held


@settings(max_examples=400, deadline=None)
@given(st.fixed_dictionaries(TRAINING_FIELDS), st.fixed_dictionaries(OPTIMIZER_FIELDS))
def test_training_validation_accepts_exactly_the_meaningful_ranges(values, opt):
  from compressive.experiment import TrainConfig

  config = dict(values, seed=0, grad_accum_steps=1, optimizer=dict(opt, name="adam"))
  assert_rejects_exactly(
    lambda: TrainConfig.from_dict(config, 8),
    expected_training_problems(values, opt),
    lambda message: {message.split("=", 1)[0]},
  )
