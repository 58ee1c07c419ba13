"""Shared test helpers: tiny configs and a jitted functional forward."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import ml_collections  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def tiny_model_config(**overrides) -> ml_collections.ConfigDict:
  values = dict(
      vocab_size=32, num_layers=2, num_heads=2, d_model=16, d_ff=32,
      segment_length=4, memory_length=8, compressed_memory_length=4,
      compression_rate=2, compression="conv", reconstruction_loss="attention",
      dropout_rate=0.0, dtype="float32")
  values.update(overrides)
  return ml_collections.ConfigDict(values)


@pytest.fixture
def tiny():
  return tiny_model_config


def make_model(cfg, seed: int = 0):
  from flax import nnx
  import compressive
  return compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(seed))


def jitted_forward(model):
  """(state, jit(fn)) with fn(state, tokens, memory, sos) -> model outputs."""
  from flax import nnx
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens, memory, sos):
    return nnx.merge(graphdef, state)(tokens, memory, sos)

  return state, forward
