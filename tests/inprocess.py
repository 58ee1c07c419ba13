"""The entry points run in the test's own process, as `python SCRIPT ARGS`
would run them: the error, warning and result tests ask questions that need
no operating system ("does `--step=-1` print one line and exit 2"), and a
tool run here costs no interpreter, no imports and no backend start.

`run(script, args, env=, cwd=)` returns what `subprocess.run(...,
capture_output=True, text=True)` would: the exit status (`sys.exit`'s code,
1 and the traceback on stderr for an exception that escapes, as the
interpreter does), stdout and stderr. For the length of the call it sets
`sys.argv`, the environment, the current folder, and the streams that
print, warnings and logging write to, and puts back afterwards everything
a tool changes in the process: absl's flags (each tool defines its own,
which are removed, and every flag is unparsed), signal handlers, logging
levels, handlers and absl's formatter, `sys.path`, the default config a tool names, and the
JAX options a tool sets (the compilation cache).

What stays for real processes (tests/processes.py):
signals, kill -9, read-only mounts, several processes, fake devices, and
an environment that decides how JAX starts (`needs_a_process`), which
this process has started already.
"""

import contextlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import traceback
from typing import Optional

from absl import flags
from absl import logging as absl_logging
import jax

# Loaded before the first run, so that the flags they define at import
# (--compilation_cache) are the process's, not a tool's.
from compressive import cli_config, cli_xla
import compressive.cli  # noqa: F401  (its flags, --compilation_cache, are the process's)
from compressive.errors import STOP_SIGNALS
from helpers import ROOT

# Environment variables read when JAX starts a backend or imports: a run
# whose environment changes one of them needs a process of its own.
JAX_START = (
  "JAX_PLATFORMS",
  "JAX_PLATFORM_NAME",
  "JAX_NUM_CPU_DEVICES",
  "JAX_ENABLE_X64",
  "CUDA_VISIBLE_DEVICES",
  "TPU_VISIBLE_CHIPS",
)
_SIGNALS = STOP_SIGNALS
_JAX_OPTIONS = (
  "jax_compilation_cache_dir",
  "jax_enable_compilation_cache",
  "jax_persistent_cache_min_compile_time_secs",
)
_LOGGERS = ("compressive", "absl", "jax", "orbax", "")
# The modules that define a tool's flags (besides its script): the shared
# flags (compressive.cli, cli_flags), --config (ml_collections) and its
# overrides (absl.flags._flag, as absl names them).
_TOOLS_FLAGS = ("compressive", "ml_collections", "absl.flags._flag")
# The tools' modules, which the root scripts run as __main__.
_TOOL_MODULES = tuple(
  f"compressive.{name}"
  for name in ("train", "eval", "sample", "analyze", "export", "train_tokenizer", "aot.__main__")
)


def needs_a_process(env: Optional[dict[str, str]]) -> bool:
  """Whether `env` changes how JAX starts (JAX_START, or XLA_FLAGS whose
  flags differ from this process's): a question only a new process answers.
  An XLA_FLAGS the tool refuses before JAX starts (cli_xla.xla_flags_problem)
  is answered here."""
  if env is None:
    return False
  if any(env.get(name) != os.environ.get(name) for name in JAX_START):
    return True
  xla = env.get("XLA_FLAGS", "")
  return xla != os.environ.get("XLA_FLAGS", "") and cli_xla.xla_flags_problem(xla) is None


def run(
  script: str, args: list[str], *, env: Optional[dict[str, str]] = None, cwd: Optional[str] = None
) -> subprocess.CompletedProcess:
  """Runs ROOT/`script` (train.py, experiments/run.py, ...) with `args` as
  `__main__` in this process, in `cwd` (default ROOT) with environment
  `env` (default this one's); see the module doc."""
  if needs_a_process(env):
    raise ValueError(f"{script}: this environment changes how JAX starts; run it in a process")
  cwd = cwd or ROOT
  # As `python SCRIPT` names it (absl's --help and key flags use the name).
  path = script if cwd == ROOT and not os.path.isabs(script) else os.path.join(ROOT, script)
  out, err = io.StringIO(), io.StringIO()
  with _restored(), _environment(env), contextlib.chdir(cwd), _streams(out, err):
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python SCRIPT` does
    code = _exit_status(path, err)
  return subprocess.CompletedProcess(
    [sys.executable, path, *args], code, out.getvalue(), err.getvalue()
  )


def _exit_status(path: str, err: io.StringIO) -> int:
  try:
    runpy.run_path(path, run_name="__main__")
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    print(e.code, file=err)  # sys.exit("message"), as the interpreter prints it
    return 1
  except BaseException:  # the interpreter's own report
    err.write(traceback.format_exc())
    return 1
  return 0


@contextlib.contextmanager
def _restored():
  """Puts back what a tool changes in the process (module doc)."""
  argv, main_doc = list(sys.argv), getattr(sys.modules["__main__"], "__doc__", None)
  path, default_configs = list(sys.path), dict(cli_config.DEFAULT_CONFIGS)
  before = set(flags.FLAGS)
  handlers = {s: signal.getsignal(s) for s in _SIGNALS}
  levels = {name: logging.getLogger(name).level for name in _LOGGERS}
  root_handlers = list(logging.root.handlers)  # absl.app adds its own on first use
  verbosity = absl_logging.get_verbosity()
  formatter = absl_logging.get_absl_handler().python_handler.formatter  # the tools set their own
  options = {name: getattr(jax.config, name) for name in _JAX_OPTIONS}
  # A tool module a test imported (to call its `run`) is set aside while its
  # script runs it as __main__, as in a process of its own; put back after.
  imported = {name: sys.modules.pop(name) for name in _TOOL_MODULES if name in sys.modules}
  modules = set(sys.modules)
  try:
    yield
  finally:
    sys.modules.update(imported)
    # A config file ml_collections loaded (as module config_<flag>): a
    # later tool's file of the same flag is loaded afresh, as in a process
    # of its own, not into the same module object, whose names it would keep.
    for name in set(sys.modules) - modules:
      if name.startswith("config_"):
        del sys.modules[name]
    argv0 = sys.argv[0]
    for name in set(flags.FLAGS) - before:
      # The tool's own flags and its --config overrides go (the next tool
      # defines its own); a library's, defined as it was first imported
      # (absl.app's --help, Orbax's, Grain's), stay: it is not imported again.
      if flags.FLAGS.find_module_defining_flag(name, "").startswith(_TOOLS_FLAGS + (argv0,)):
        delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
    for s, handler in handlers.items():
      signal.signal(s, handler)
    for name, level in levels.items():
      logging.getLogger(name).setLevel(level)
    logging.root.handlers[:] = root_handlers
    absl_logging.set_verbosity(verbosity)
    absl_logging.get_absl_handler().python_handler.setFormatter(formatter)
    for name, value in options.items():
      jax.config.update(name, value)
    sys.argv, sys.path[:] = argv, path
    sys.modules["__main__"].__doc__ = main_doc
    cli_config.DEFAULT_CONFIGS.clear()  # each tool names its own default config
    cli_config.DEFAULT_CONFIGS.update(default_configs)


@contextlib.contextmanager
def _environment(env: Optional[dict[str, str]]):
  saved = dict(os.environ)
  if env is not None:
    os.environ.clear()
    os.environ.update(env)
  try:
    yield
  finally:
    os.environ.clear()
    os.environ.update(saved)


@contextlib.contextmanager
def _streams(out: io.StringIO, err: io.StringIO):
  """print, warnings and logging (absl's handler, or Python's last resort)
  write to `out` and `err` for the run."""
  absl_handler = absl_logging.get_absl_handler()
  if absl_handler not in logging.root.handlers:  # app.run adds it on its first run only
    logging.root.addHandler(absl_handler)  # (_restored takes it away again)
  handler = absl_handler.python_handler
  saved = handler.stream
  handler.stream = err
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      yield
  finally:
    handler.stream = saved
