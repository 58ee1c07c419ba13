"""Invalid model configs fail at construction with one error naming the field."""

import dataclasses

from flax import nnx
import jax.numpy as jnp
import ml_collections
import pytest

import compressive
from helpers import tiny_model_config

BAD = [
  (dict(segment_length=5, compression_rate=2), "model.segment_length=5"),
  (dict(d_model=10, num_heads=4), "model.d_model=10"),
  (dict(memory_length=-1), "model.memory_length=-1"),
  (dict(compressed_memory_length=-2), "model.compressed_memory_length=-2"),
  (dict(num_layers=0), "model.num_layers=0"),
  (dict(vocab_size=0), "model.vocab_size=0"),
  (dict(compression_rate=0), "model.compression_rate=0"),
  (dict(compression="avg_pool"), "model.compression='avg_pool'"),
  (dict(reconstruction_loss="l2"), "model.reconstruction_loss='l2'"),
  (dict(memory_length=0, compressed_memory_length=4), "model.compressed_memory_length=4"),
  (dict(dropout_rate=1.5), "model.dropout_rate=1.5"),
  (dict(dtype="float64"), "model.dtype='float64'"),
  (dict(d_ff=2.5), "model.d_ff=2.5"),
]


@pytest.mark.parametrize("overrides,field", BAD)
def test_bad_config_names_the_field(overrides, field):
  with pytest.raises(compressive.ConfigError) as info:
    compressive.CompressiveTransformer(tiny_model_config(**overrides), rngs=nnx.Rngs(0))
  assert field in str(info.value)
  assert str(info.value).count("\n") == 0  # one line


def test_missing_field_is_named():
  section = dataclasses.asdict(tiny_model_config())
  del section["d_ff"]
  with pytest.raises(compressive.ConfigError, match="model.d_ff is missing"):
    compressive.ModelConfig.from_config(section)


def test_the_model_takes_a_model_config_only():
  # A config's model section is read once, checked, by ModelConfig.from_config.
  section = ml_collections.ConfigDict(dataclasses.asdict(tiny_model_config()))
  for build in (
    lambda: compressive.CompressiveTransformer(section, rngs=nnx.Rngs(0)),
    lambda: compressive.init_memory(section, 2),
  ):
    with pytest.raises(
      TypeError,
      match=r"takes a ModelConfig, not ConfigDict: "
      r"ModelConfig.from_config\(config.model\)",
    ):
      build()


def test_eval_memory_sizes_are_checked():
  cfg = tiny_model_config()
  with pytest.raises(compressive.ConfigError, match="memory_length"):
    compressive.init_memory(cfg, 2, memory_length=0, compressed_memory_length=4)
  txl = tiny_model_config(compressed_memory_length=0)
  with pytest.raises(compressive.ConfigError, match="no compressor"):
    compressive.init_memory(txl, 2, compressed_memory_length=4)


def test_rate_need_not_divide_segment_without_compressed_memory():
  # Transformer-XL ignores the rate: no special case for the user.
  cfg = tiny_model_config(compressed_memory_length=0, segment_length=5, compression_rate=2)
  model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0))
  memory = compressive.init_memory(cfg, 2)
  tokens = jnp.arange(20, dtype=jnp.int32).reshape(2, 10) % cfg.vocab_size
  for segment in (tokens[:, :5], tokens[:, 5:]):  # the second sees the first in memory
    logits, memory, _ = model(segment, memory, None)
    assert logits.shape == (2, 5, cfg.vocab_size) and bool(jnp.isfinite(logits).all())
