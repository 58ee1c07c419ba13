"""Adding a compression is one class in one file: this file registers a toy
compression, and the framework builds, shards, trains and restores it with no
other change."""

import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive import config as config_lib
from compressive.model.compression import COMPRESSIONS, Compression, register
from compressive.model.config import ModelConfig
from compressive.model.layers import param
from compressive.scale import sharding
from compressive.training import loop as train_lib
from helpers import make_model, tiny_experiment, tiny_model_config, to_train


class ScaledLast(Compression):
  """Keeps the newest slot of each group of c, times a learned gain per channel."""

  name = "test_scaled_last"

  def __init__(self, rate, d_model, *, rngs, param_dtype=jnp.float32):
    super().__init__(rate, d_model, rngs=rngs, param_dtype=param_dtype)
    self.gain = param(nnx.initializers.ones, None, (d_model,), ("norm",), param_dtype)

  def __call__(self, slots, mask, usage):
    out = self.groups(slots)[:, :, -1] * self.gain[...].astype(slots.dtype)
    return out, self.groups(mask).any(-1)


@pytest.fixture
def registered():
  register(ScaledLast)
  yield ScaledLast.name
  del COMPRESSIONS[ScaledLast.name]  # the other tests iterate over the built-in ones


@pytest.mark.slow
def test_a_compression_registered_here_trains_and_restores(registered, tmp_path):
  config = tiny_experiment(
    num_train_steps=2,
    checkpoint_every_steps=2,
    eval_every_steps=0,
    log_every_steps=1,
    **{"model.compression": registered},
  )
  # Its parameter has logical axes, so every mesh can place it.
  model = nnx.eval_shape(
    lambda: compressive.CompressiveTransformer(
      ModelConfig.from_config(config.model), rngs=nnx.Rngs(0)
    )
  )
  table = sharding.logical_axes(nnx.state(model))
  assert table["blocks/0/compressor/fn/gain"] == ("norm",)
  train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"))
  _, model = compressive.load(str(tmp_path / "wd"))
  gains = [np.asarray(block.compressor.fn.gain[...]) for block in model.blocks]
  # The reconstruction loss reached the gains and only training moved them.
  assert all(np.all(np.isfinite(g)) for g in gains)
  assert any(not np.allclose(g, 1.0) for g in gains)


def test_an_unknown_compression_is_named_with_the_registered_ones():
  with pytest.raises(
    compressive.ConfigError, match="model.compression='nope' is unknown; choose one of max_pool"
  ):
    config_lib.check(tiny_experiment(**{"model.compression": "nope"}), here=False)


def test_a_name_is_registered_once():
  class Other(ScaledLast):
    name = "max_pool"

  with pytest.raises(ValueError, match="'max_pool' is already registered"):
    register(Other)


# -- A compression is held to its contract when the model is traced. --------------


class Uncompressed(Compression):
  """Returns every slot: [B, N, d] where [B, N/c, d] is due."""

  name = "test_uncompressed"

  def __call__(self, slots, mask, usage):
    return slots, mask


class Raising(Compression):
  name = "test_raising"

  def __call__(self, slots, mask, usage):
    raise ValueError("my own bug")


class AsList(Compression):
  name = "test_as_list"

  def __call__(self, slots, mask, usage):
    return [self.groups(slots).mean(2), self.groups(mask).any(-1)]


class FloatMask(Compression):
  name = "test_float_mask"

  def __call__(self, slots, mask, usage):
    return self.groups(slots).mean(2), self.groups(mask).any(-1).astype(jnp.float32)


@pytest.mark.parametrize(
  "cls,said",
  [
    (
      Uncompressed,
      r"returned \(float32\[2, 4, 16\], bool\[2, 4\]\) for \[2, 4, 16\] slots at "
      r"rate 2; a compression returns \(\[2, 2, 16\] floating slots, "
      r"\[2, 2\] bool mask\)",
    ),
    (Raising, r"raised ValueError on \[2, 4, 16\] slots: my own bug"),
    (AsList, r"returned a list of 2; a compression returns a tuple"),
    (FloatMask, r"returned \(float32\[2, 2, 16\], float32\[2, 2\]\)"),
  ],
)
def test_a_compression_that_breaks_its_contract_is_one_line_naming_it(cls, said):
  register(cls)
  try:
    cfg = ModelConfig.from_config(tiny_model_config(compression=cls.name))
    model = make_model(cfg)
    tokens = jnp.zeros((2, cfg.segment_length), jnp.int32)
    memory = compressive.init_memory(cfg, 2)
    with pytest.raises(compressive.ConfigError) as e:
      jax.eval_shape(lambda t, m: model(t, m, None), tokens, memory)  # traced, not run
  finally:
    del COMPRESSIONS[cls.name]
  message = str(e.value)
  assert message.startswith(f"model.compression='{cls.name}' ({__name__}.{cls.__name__}) "), message
  assert "\n" not in message
  assert re.search(said, message), message
