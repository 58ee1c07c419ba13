"""The session's set-up: float32 matmuls at highest precision, and one JAX
compilation cache for the test processes and the processes they start,
and XLA's CPU backend at optimisation level 0.

`compressive` and `configs` are imported as installed (`pip install -e .`,
which `make test` runs). The tests' shared helpers are in helpers.py, which
test modules import by name (pyproject.toml puts tests/ on sys.path); test
modules never import each other.

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

# XLA's CPU backend at optimisation level 0 (LLVM's -O0 for the generated
# code) for this process and every process it starts, set before JAX is
# imported: the tests' programs are tiny, so compiling them is most of their
# time, and -O0 compiles them about a third faster (a cold tiny
# train_and_evaluate on 2 cores: 8.0-8.4 s instead of 11.7-12.3 s; the whole
# suite in a fresh clone: 9 min 41 s to 10 min 9 s instead of 14-16 min). The
# values differ from the default level's by float rounding only (the tiny
# run's loss: 6.21796727 against 6.21796763), which every tolerance here is
# wider than (docs/TESTS.md); the default experiment (`make experiment`) runs
# at XLA's default level, and bit-identical resume is tested there as well
# (training/test_robustness.py). A level in XLA_FLAGS already is kept:
# `XLA_FLAGS=--xla_backend_optimization_level=3 make test` runs the suite as
# XLA compiles by default. Tests that start processes with more flags (fake
# devices) add to these (helpers.xla_flags).
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]))

import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

import zygote  # pylint: disable=wrong-import-position

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
  # closure, and the cache keys on the compiled program (training/test_train.py and
  # training/test_grad_accum.py: 171 s -> 114 s).
  path = os.environ["COMPRESSIVE_COMPILATION_CACHE"]
  if path:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  # Entry points the tests start are forked from an interpreter that has
  # imported the libraries already (tests/zygote.py): about 3 s of CPU less
  # for each of some 250 processes. Installed after the environment above is
  # set, which is the environment the server imports with.
  zygote.install()


@pytest.fixture(autouse=True)
def _fresh_interpreter(request):
  """Tests marked fresh_interpreter start every process as a new interpreter."""
  if request.node.get_closest_marker("fresh_interpreter") is None:
    yield
  else:
    with zygote.disabled():
      yield


def pytest_unconfigure(config):
  del config
  if _SESSION_CACHE is not None:
    os.environ.pop("COMPRESSIVE_COMPILATION_CACHE", None)
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
