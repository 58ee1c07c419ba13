"""The session's set-up: float32 matmuls at highest precision, one JAX
compilation cache for the test processes and the processes they start,
JAX's `jax_disable_most_optimizations`, etils.epath's Cloud Storage through
gcsfs, and a count of the processes tests start: a test that starts one
must be marked `slow`.

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

import multiprocessing
import os
import platform
import shutil
import subprocess
import tempfile

# JAX's switch for programs whose compilation costs more than their running
# (jax_disable_most_optimizations: XLA's CPU backend at level 0 and LLVM's
# expensive passes off), for this process and every process it starts, set
# before JAX is imported: the tests' programs are tiny, so compiling them is
# most of their time. The values differ from the default level's by float
# rounding only, which every tolerance here is wider than (docs/TESTS.md);
# the default experiment (`make experiment`) runs at XLA's default level,
# and so do the tests that hold a promise about users' runs there
# (bit-identical resume: training/test_robustness.py) and `make
# test-default-level`. A value set already is kept:
# `JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` runs the suite as JAX
# compiles by default.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# The suite's Cloud Storage is the server training/test_remote.py starts,
# which etils.epath (and Orbax through it) reaches through gcsfs; with
# TensorFlow installed epath would take TensorFlow's file layer, which knows
# no such server, and it decides once per process, at its first path.
os.environ.setdefault("EPATH_USE_TF", "false")

import jax  # noqa: E402
import pytest  # noqa: E402

import processes  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

_SESSION_CACHE = None
_SESSION_XDG = None


def pytest_configure(config):
  del config
  # The standard library's first platform.processor() runs `uname -p`: asked
  # here once, so that no test that happens to import a library asking it
  # (TensorBoard, TFDS) is counted as starting a process.
  platform.processor()
  global _SESSION_CACHE
  if "COMPRESSIVE_COMPILATION_CACHE" not in os.environ:
    _SESSION_CACHE = tempfile.mkdtemp(prefix="compressive-test-jax-cache-")
    os.environ["COMPRESSIVE_COMPILATION_CACHE"] = _SESSION_CACHE
  # The tests' programs are tiny: each compiles in well under JAX's default
  # 1 s threshold for the persistent cache, so without this every process
  # the tests start compiles them again. The same programs give the same
  # results either way.
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  # The test processes themselves (pytest-xdist's workers too) use it as
  # well: tests build the same tiny steps again and again, each a new jit
  # closure, and the cache keys on the compiled program.
  path = os.environ["COMPRESSIVE_COMPILATION_CACHE"]
  if path:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  # Generated documents (data/generated.py: the recall task's) are cached
  # under $XDG_CACHE_HOME: for the session, a temporary folder, not the
  # user's ~/.cache.
  # Matplotlib keeps its font cache where it was (under the user's cache
  # folder): a new one would be built by running fc-list, a process.
  global _SESSION_XDG
  if "XDG_CACHE_HOME" not in os.environ:
    os.environ.setdefault(
      "MPLCONFIGDIR", os.path.join(os.path.expanduser("~"), ".cache", "matplotlib")
    )
    _SESSION_XDG = tempfile.mkdtemp(prefix="compressive-test-cache-")
    os.environ["XDG_CACHE_HOME"] = _SESSION_XDG
  processes.keep_environment()  # what the tests' fork server imports with
  _count_processes()


@pytest.fixture(autouse=True)
def _fresh_interpreter(request):
  """Tests marked fresh_interpreter start every process as a new interpreter."""
  if request.node.get_closest_marker("fresh_interpreter") is None:
    yield
  else:
    with processes.disabled():
      yield


# -- Processes: each test that starts one is marked slow, and each is counted. --

_PROCESSES = []  # (the test's id, how, the command) of every process started here
_CURRENT = {"test": "(no test)"}
_FIRST = pytest.StashKey[int]()


def _count_processes() -> None:
  """Records every process started from now on: each subprocess.Popen, and
  each child tests/processes.py forks from its server."""
  popen, fork = subprocess.Popen, processes._fork

  def record(args, how: str) -> None:
    command = args if isinstance(args, str) else " ".join(map(os.fsdecode, args))
    _PROCESSES.append((_CURRENT["test"], how, command.replace("\n", "\\n")))

  class Counted(popen):
    def __init__(self, args, *rest, **kwargs):
      record(args, "started")
      super().__init__(args, *rest, **kwargs)

  def counted_fork(args, *rest):
    record(args, "forked")
    return fork(args, *rest)

  subprocess.Popen = Counted
  processes._fork = counted_fork


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
  _CURRENT["test"] = item.nodeid
  item.stash[_FIRST] = len(_PROCESSES)
  return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  result = yield
  started = len(_PROCESSES) - item.stash[_FIRST]
  if started and item.get_closest_marker("slow") is None:
    pytest.fail(
      f"{item.nodeid} started {started} process(es) (its fixtures too) without "
      "@pytest.mark.slow: `make test-fast` runs no process",
      pytrace=False,
    )
  return result


def pytest_unconfigure(config):
  del config
  log = os.environ.get("COMPRESSIVE_TEST_PROCESSES")
  if log:  # one line per process started, for counting them (docs/TESTS.md)
    with open(log, "a") as f:
      f.writelines("\t".join(process) + "\n" for process in _PROCESSES)
  for child in multiprocessing.active_children():  # a failed test's, left running
    child.kill()
  if _SESSION_CACHE is not None:
    os.environ.pop("COMPRESSIVE_COMPILATION_CACHE", None)
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
  if _SESSION_XDG is not None:
    os.environ.pop("XDG_CACHE_HOME", None)
    shutil.rmtree(_SESSION_XDG, ignore_errors=True)
