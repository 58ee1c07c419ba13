"""Python processes for the tests whose subject is the operating system
(signals, kill -9, read-only mounts, several processes, fake devices):
`start` gives a handle as subprocess.Popen does, `run` a CompletedProcess.

A new interpreter spends about 3 s of CPU importing JAX, Flax, Orbax and
compressive before it does what the test is about. Here the standard
library's fork server (multiprocessing's "forkserver") imports them once per
pytest process, and a command `[sys.executable, script.py | -m module | -c
code, *args]` is a child forked from it: it takes the command's standard
streams, folder, environment and arguments, runs as `__main__` as `python`
would, and exits as the interpreter does (threads joined, exit functions
run, streams flushed). Its pid can be signalled; its exit status is the
script's, or minus the signal's number.

Any other command starts a new interpreter (subprocess.Popen), as does one
whose environment differs from the server's in what is read while the
libraries import (PYTHON*, TF_*, LD_*, thread-pool sizes, a JAX_* variable
that is no JAX option), every command of a test marked `fresh_interpreter`,
and every command with COMPRESSIVE_TEST_FORK=0. A JAX option the
environment sets otherwise is set in the child through jax.config. What
differs from a new interpreter: the libraries are imported before the script
runs, and the child's parent is the server. tests/tools/test_processes.py holds
these promises.
"""

import atexit
import contextlib
import json
import multiprocessing
from multiprocessing import forkserver, reduction
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import types

import jax  # (it sets variables of its own: imported before the server's environment is read)

# Imported by the server once, before it forks: what the entry points import.
PRELOAD = ["absl.app", "absl.flags", "absl.logging", "ml_collections", "numpy", "jax"]
PRELOAD += ["flax", "flax.nnx", "optax", "orbax.checkpoint", "compressive", "compressive.cli"]
PRELOAD += ["compressive.training.loop", "compressive.evaluation.evaluate", __name__]
_FIXED = ("PYTHON", "TF_", "LD_", "OMP_", "MKL_", "OPENBLAS_")
_TRUE, _FALSE = ("1", "true", "t", "yes", "y", "on"), ("0", "false", "f", "no", "n", "off")
SWITCH = "COMPRESSIVE_TEST_FORK"
_SERVER = {"env": None, "path": None}  # the kept environment; sys.path once started
_CONTEXT = multiprocessing.get_context("forkserver")
_DISABLED = [False]
_LOCK = threading.Lock()


def keep_environment() -> None:
  """The server imports with this process's environment as it is now, not
  as a test has changed it when the first command starts the server
  (conftest.py calls this once it has set the session's variables)."""
  _SERVER["env"] = dict(os.environ)


@contextlib.contextmanager
def disabled():
  """Commands started inside (from any thread) start a new interpreter."""
  before, _DISABLED[0] = _DISABLED[0], True
  try:
    yield
  finally:
    _DISABLED[0] = before


def _jax_options(env: dict) -> dict | None:
  """{JAX option: value} the child sets, or None: a new interpreter."""
  out: dict = {}
  base = _SERVER["env"] or os.environ
  for key in (k for k in set(base) | set(env) if base.get(k) != env.get(k)):
    if key.startswith(_FIXED) or (key.startswith("JAX_") and key not in env):
      return None
    if key.startswith("JAX_"):
      name, text, kind = key.lower(), env[key], type(jax.config.values.get(key.lower(), ...))
      if kind is bool and text.lower() in _TRUE + _FALSE:
        out[name] = text.lower() in _TRUE
      elif kind in (int, float, str, type(None)):
        try:
          out[name] = text if kind in (str, type(None)) else kind(text)
        except ValueError:
          return None
      else:
        return None
  return out


def _forkable(args: list, cwd, env) -> dict | None:
  """The JAX options a forked child sets, or None: a new interpreter."""
  if _DISABLED[0] or os.environ.get(SWITCH, "1").lower() in _FALSE:
    return None
  if len(args) < 2 or args[0] != sys.executable:
    return None
  if args[1] in ("-m", "-c"):
    if len(args) < 3:
      return None
  elif not (args[1].endswith(".py") and os.path.isfile(os.path.join(cwd or os.getcwd(), args[1]))):
    return None
  return _jax_options(dict(os.environ if env is None else env))


def _as_main(argv: list[str], path: list[str]) -> None:
  """Runs `argv` (after the interpreter's name) as `python` would."""
  if argv[0] == "-m":
    sys.argv, sys.path[:] = [argv[1], *argv[2:]], [os.getcwd(), *path]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
  elif argv[0] == "-c":
    sys.argv, sys.path[:] = ["-c", *argv[2:]], ["", *path]
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    exec(compile(argv[1], "<string>", "exec"), main.__dict__)
  else:
    sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *path]
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


def _fd(dup) -> int:
  return dup.detach()


class _Passed:
  """A file descriptor that travels to the forked child with the command."""

  def __init__(self, fd: int):
    self.fd = fd

  def __reduce__(self):
    return _fd, (reduction.DupFd(self.fd),)


def _child(argv, cwd, env, options, fds, path) -> None:
  """In the forked child: the command's streams, folder and environment, the
  command, then the interpreter's exit."""
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
  for fd in set(fds) - {0, 1, 2}:
    os.close(fd)
  sys.stdin = open(0, closefd=False)  # (the fork server had given it /dev/null)
  os.chdir(cwd)
  os.environ.clear()
  os.environ.update(env)
  if options:
    for name, value in options.items():
      jax.config.update(name, value)
  try:
    _as_main(argv, path)
    code = 0
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) or e.code is None else 1
    if code is not e.code:
      print(e.code, file=sys.stderr)
  except KeyboardInterrupt:  # as the interpreter ends: by the signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  except BaseException:
    sys.excepthook(*sys.exc_info())
    code = 1
  for thread in threading.enumerate():  # the interpreter's exit, in its order
    if thread is not threading.current_thread() and not thread.daemon:
      thread.join()
  atexit._run_exitfuncs()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  os._exit(code or 0)


class Forked:
  """A forked child, with the part of subprocess.Popen's interface tests use."""

  def __init__(self, args, process, streams):
    self.args, self._process, self.returncode = args, process, None
    self._read: dict = {}
    self._readers: list = []
    self.pid = process.pid
    self.stdin, self.stdout, self.stderr = streams

  def poll(self) -> int | None:
    if self.returncode is None:
      self.returncode = self._process.exitcode
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    self._process.join(timeout)
    if self.poll() is None:
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, input=None, timeout=None):
    if not self._readers:
      if self.stdin:
        if input:
          self.stdin.write(input)
        self.stdin.close()
      for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
        if stream:
          self._readers.append(
            threading.Thread(target=self._drain, args=(name, stream), daemon=True)
          )
          self._readers[-1].start()
    end = None if timeout is None else time.monotonic() + timeout
    for thread in self._readers:
      thread.join(None if end is None else max(0, end - time.monotonic()))
      if thread.is_alive():
        raise subprocess.TimeoutExpired(self.args, timeout)
    self.wait(None if end is None else max(0, end - time.monotonic()))
    return self._read.get("stdout"), self._read.get("stderr")

  def _drain(self, name: str, stream) -> None:
    with stream:
      self._read[name] = stream.read()

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, sig)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


def _start_server() -> None:
  """The fork server, started once, in the environment kept (keep_environment)."""
  with _LOCK:
    if _SERVER["path"] is not None:
      return
    now = dict(os.environ)
    base = _SERVER["env"] = _SERVER["env"] or now
    probe = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"]
    _SERVER["path"] = json.loads(subprocess.check_output(probe, env=base))
    _CONTEXT.set_forkserver_preload(PRELOAD)
    os.environ.clear()
    os.environ.update(base)
    try:
      forkserver.ensure_running()
    finally:
      os.environ.clear()
      os.environ.update(now)


def _stream(choice, number: int, text: bool):
  """(the descriptor the child takes as `number`, the parent's end or None,
  a descriptor to close once the child has its own) for Popen's choice."""
  if choice == subprocess.DEVNULL:
    fd = os.open(os.devnull, os.O_RDWR)
    return fd, None, fd
  if choice == subprocess.PIPE:
    read, write = os.pipe()
    child, mine = (read, write) if number == 0 else (write, read)
    return child, open(mine, ("w" if number == 0 else "r") + ("" if text else "b")), child
  return (
    number if choice is None else choice if isinstance(choice, int) else choice.fileno(),
    None,
    None,
  )


def _fork(args, cwd, env, options, stdin, stdout, stderr, text) -> Forked:
  """Forks the command from the server, its standard streams passed as Popen
  takes them (None, PIPE, DEVNULL, a file or a descriptor)."""
  _start_server()
  fds, streams, ours = [], [], []
  for number, choice in enumerate((stdin, stdout, stderr)):
    fd, mine, close = _stream(choice, number, text)
    fds.append(fd)
    streams.append(mine)
    ours += [close] if close is not None else []
  env = dict(os.environ if env is None else env)
  where = os.path.abspath(cwd or os.getcwd())
  process = _CONTEXT.Process(
    target=_child, args=(args[1:], where, env, options, [_Passed(f) for f in fds], _SERVER["path"])
  )
  process.start()
  for fd in ours:
    os.close(fd)
  return Forked(args, process, streams)


def start(args, *, cwd=None, env=None, stdin=None, stdout=None, stderr=None, text=False):
  """The command as a process: forked from the server where it can be (above)."""
  args = [os.fsdecode(a) for a in args]
  options = _forkable(args, cwd and os.fspath(cwd), env)
  if options is None:
    return subprocess.Popen(
      args, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr, text=text
    )
  return _fork(args, cwd and os.fspath(cwd), env, options, stdin, stdout, stderr, text)


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
  """subprocess.run's result for the command, started by `start`."""
  if capture_output:
    kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
  if input is not None:
    kwargs["stdin"] = subprocess.PIPE
  p = start(args, **kwargs)
  try:
    out, err = p.communicate(input, timeout=timeout)
  except subprocess.TimeoutExpired:
    p.kill()
    p.wait()
    raise
  result = subprocess.CompletedProcess(args, p.returncode, out, err)
  if check:
    result.check_returncode()
  return result
