"""Shared test helpers: tiny configs and a jitted functional forward.

`compressive` and `configs` are imported as installed (`pip install -e .`,
which `make test` runs), and test modules import each other (`from test_train
import ...`) through pytest's default `prepend` import mode, which puts this
folder on sys.path.

The test processes and the entry points they start share one JAX
compilation cache for the session, in a temporary folder, not the user's
~/.cache/compressive/jax (unless COMPRESSIVE_COMPILATION_CACHE is set
already; tests that set JAX's own JAX_COMPILATION_CACHE_DIR for their
processes keep it), and every program goes into it, however quickly it
compiled.
"""

import os
import shutil
import tempfile

import jax
import ml_collections
import pytest

jax.config.update("jax_default_matmul_precision", "highest")

_SESSION_CACHE = None


def pytest_configure(config):
  del config
  global _SESSION_CACHE
  if "COMPRESSIVE_COMPILATION_CACHE" not in os.environ:
    _SESSION_CACHE = tempfile.mkdtemp(prefix="compressive-test-jax-cache-")
    os.environ["COMPRESSIVE_COMPILATION_CACHE"] = _SESSION_CACHE
  # The tests' programs are tiny: each compiles in well under JAX's default
  # 1 s threshold for the persistent cache, so without this every process
  # the tests start compiles them again (a warm tiny train.py run: 3.2 s
  # instead of 4.6 s). The same programs give the same results either way.
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  # The test processes themselves (pytest-xdist's workers too) use it as
  # well: tests build the same tiny steps again and again, each a new jit
  # closure, and the cache keys on the compiled program (test_train.py and
  # test_grad_accum.py: 171 s -> 114 s).
  path = os.environ["COMPRESSIVE_COMPILATION_CACHE"]
  if path:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def pytest_unconfigure(config):
  del config
  if _SESSION_CACHE is not None:
    os.environ.pop("COMPRESSIVE_COMPILATION_CACHE", None)
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


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
