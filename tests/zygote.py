"""Python processes for the tests, forked from an interpreter that has
already imported JAX, Flax, Orbax and compressive.

Tests whose subject is the operating system (signals, kill -9, read-only
mounts, several processes, fake devices, an installed package) start an
entry point as a process (`python train.py ...`, `python -m
compressive.eval ...`; the others run tools in process, tests/inprocess.py),
and each new interpreter spends about 3 s of CPU importing the same
libraries before it does what the test is about. Here each pytest process
starts one server (this file, run as a script) that imports them once and
then forks a child per request; the child takes the request's standard
streams, working directory, environment and arguments, and runs the script
or module as `__main__`, as `python` would. To the test the child is an
ordinary `subprocess.Popen`: its pid can be signalled (SIGTERM, SIGKILL),
its exit status is the script's (or the signal's), its output arrives on the
test's pipes.

`install()` (called by conftest.py) puts `Popen` in the subprocess module's
place. A command is forked only when it is this interpreter
(`sys.executable`) running a `.py` file or `-m module` with none of Popen's
process options (shell, preexec_fn, sessions, users, extra fds), and its
environment agrees with the server's on what is read while importing
(PYTHON*, TF_*, LD_*, thread-pool sizes; JAX_* variables are set as JAX's
config options in the child, `_jax_differences`); any other command, and
every command of a test marked `fresh_interpreter`, starts a new
interpreter as before. What differs from a new interpreter: the libraries
above are imported before the script runs (so a test about what happens
while they import, or about what is imported at all, is marked
`fresh_interpreter`), and the child's parent is the server.

The server serves one pytest process: it exits when that process's end of
its standard input closes (the process exited, however it ended). It is
installed only on the Pythons it was written against (`PYTHONS`, and
Popen's private signature checked), and `COMPRESSIVE_TEST_ZYGOTE=0` turns it
off; tests/tools/test_zygote.py holds its promises.
"""

import atexit
import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

# Imported once by the server, before any fork: what the entry points import.
PRELOAD = (
  "absl.app",
  "absl.flags",
  "absl.logging",
  "ml_collections",
  "numpy",
  "jax",
  "jax.numpy",
  "flax",
  "flax.nnx",
  "optax",
  "orbax.checkpoint",
  "compressive",
  "compressive.cli",
  "compressive.cli_config",
  "compressive.cli_flags",
  "compressive.training.loop",
  "compressive.evaluation.evaluate",
)
# Environment variables read while those libraries import, or by the
# interpreter itself at start-up: a command whose environment differs from
# the server's in any of them starts a new interpreter. JAX_* variables are
# JAX's config options, read when jax is imported: the child sets the ones
# that differ through jax.config, as the import would have (one that is no
# config option, or that the command's environment removes, starts a new
# interpreter). XLA_FLAGS and the rest are read when a backend starts, which
# the server never does.
_FIXED_PREFIXES = ("PYTHON", "TF_", "LD_", "OMP_", "MKL_", "OPENBLAS_")
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")
_STATUS = struct.Struct("i")
_ORIGINAL_POPEN = subprocess.Popen
_BASE_ENV = {}  # the environment the server starts with: install()'s


def _jax_option(name: str, text: str):
  """The value for JAX config option `name` from environment text, as jax's
  import reads it (validated by jax.config.update in the child, not here:
  this process's backends have started). KeyError when `name` is no option
  or of a kind this does not read."""
  from jax._src import config

  holders = getattr(getattr(config, "config", None), "_value_holders", {})
  parser = getattr(holders[name], "_parser", None)  # (private: another JAX may lack it)
  kind = getattr(parser, "__qualname__", "").split(".")[0]
  if kind == "bool_state":
    if text.lower() not in _TRUE + _FALSE:
      raise KeyError(name)
    return text.lower() in _TRUE
  if kind == "int_state":
    return int(text)
  if kind == "float_state":
    return float(text)
  if kind in (
    "string_state",
    "string_or_object_state",
    "optional_string_state",
    "enum_state",
    "optional_enum_state",
  ):
    return text
  raise KeyError(name)


def _jax_differences(server_env: dict, env: dict):
  """{option: value} for the JAX_* variables `env` sets otherwise than the
  server's environment; None when a difference cannot be set that way."""
  out = {}
  for key in set(server_env) | set(env):
    if server_env.get(key) == env.get(key):
      continue
    if key.startswith(_FIXED_PREFIXES):
      return None
    if key.startswith("JAX_"):
      if key not in env:
        return None
      try:
        out[key.lower()] = _jax_option(key.lower(), env[key])
      except (KeyError, ValueError, TypeError, AttributeError, ImportError):
        return None  # not an option this knows how to read: a new interpreter
  return out


# -- The server. -------------------------------------------------------------


def _run_as_main(argv: list[str]) -> None:
  """Runs `argv` (after the interpreter) as `python` would, in this process."""
  import runpy
  import types

  if argv[0] == "-m":
    sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path in argv[0]
    sys.path[0] = os.getcwd()
    runpy._run_module_as_main(argv[1])
    return
  path = os.path.abspath(argv[0])
  sys.argv = list(argv)
  sys.path[0] = os.path.dirname(path)
  main = types.ModuleType("__main__")
  main.__file__ = path
  main.__builtins__ = __builtins__
  sys.modules["__main__"] = main
  with open(path, "rb") as f:
    code = compile(f.read(), path, "exec")
  exec(code, main.__dict__)


def _child(request: dict, fds: list[int]) -> None:
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
  for fd in set(fds):
    if fd > 2:
      os.close(fd)
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  if request["jax"]:
    import jax

    for name, value in request["jax"].items():
      jax.config.update(name, value)
  signal.set_wakeup_fd(-1)
  signal.signal(signal.SIGCHLD, signal.SIG_DFL)
  _run_as_main(request["argv"])
  # The script returned: the interpreter exits 0 after its usual shutdown
  # (atexit, threads joined, streams flushed), as `python script.py` does.
  raise SystemExit(0)


def _receive(conn):
  data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
  return (json.loads(data) if data else None), fds


def serve(path: str) -> None:
  """Imports PRELOAD, then forks a child per request on the socket `path`."""
  for name in PRELOAD:
    importlib.import_module(name)
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  listener.bind(path)
  listener.listen(64)
  wake_r, wake_w = socket.socketpair()
  wake_r.setblocking(False)
  wake_w.setblocking(False)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  signal.set_wakeup_fd(wake_w.fileno())
  children = {}  # pid -> the connection its status goes to
  sys.stdout.write("ready\n")
  sys.stdout.flush()
  while True:
    try:
      ready, _, _ = select.select([listener, wake_r, sys.stdin], [], [], 1.0)
    except InterruptedError:
      ready = []
    if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
      os._exit(0)  # the pytest process closed our stdin: it is done
    if wake_r in ready:
      try:
        wake_r.recv(4096)
      except BlockingIOError:
        pass
    while children:
      try:
        pid, status = os.waitpid(-1, os.WNOHANG)
      except ChildProcessError:
        break
      if pid == 0:
        break
      conn = children.pop(pid, None)
      if conn is not None:
        try:
          conn.send(_STATUS.pack(status))
        except OSError:
          pass
        conn.close()
    if listener in ready:
      conn, _ = listener.accept()
      request, fds = _receive(conn)
      if request is None:
        conn.close()
        continue
      pid = os.fork()
      if pid == 0:
        listener.close()
        wake_r.close()
        wake_w.close()
        for other in children.values():
          other.close()
        conn.close()
        _child(request, fds)  # raises SystemExit (or the script's error)
      for fd in fds:
        os.close(fd)
      children[pid] = conn
      conn.send(_STATUS.pack(pid))


# -- The client: Popen in the subprocess module's place. ---------------------


class _Server:
  """This pytest process's server, started on first use."""

  def __init__(self):
    self.lock = threading.Lock()
    self.proc = None
    self.path = None

  def address(self):
    with self.lock:
      if self.proc is None:
        folder = tempfile.mkdtemp(prefix="compressive-zygote-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        self.path = os.path.join(folder, "socket")
        self.proc = _ORIGINAL_POPEN(
          [sys.executable, os.path.abspath(__file__), self.path],
          stdin=subprocess.PIPE,
          stdout=subprocess.PIPE,
          env=dict(_BASE_ENV),
        )
        line = self.proc.stdout.readline()
        if line != b"ready\n":
          raise RuntimeError(f"the test process server did not start: {line!r}")
      return self.path


_SERVER = _Server()
_DISABLED = [False]


@contextlib.contextmanager
def disabled():
  """Commands started inside (from any thread) start a new interpreter."""
  before = _DISABLED[0]
  _DISABLED[0] = True
  try:
    yield
  finally:
    _DISABLED[0] = before


def _forkable(
  args,
  executable,
  preexec_fn,
  pass_fds,
  env,
  shell,
  gid,
  gids,
  uid,
  umask,
  start_new_session,
  process_group,
  cwd,
):
  """The JAX options to set in a forked child for this command (usually
  none), or None when it starts a new interpreter (module doc)."""
  if _DISABLED[0] or shell or executable or preexec_fn or pass_fds:
    return None
  if any(x not in (None, -1) for x in (gid, gids, uid, process_group)) or umask != -1:
    return None
  if start_new_session or isinstance(args, (str, bytes)):
    return None
  args = [os.fsdecode(a) for a in args]
  if len(args) < 2 or args[0] != sys.executable:
    return None
  if args[1] == "-m":
    ok = len(args) >= 3
  else:
    script = os.path.join(os.fsdecode(cwd) if cwd else os.getcwd(), args[1])
    ok = args[1].endswith(".py") and os.path.isfile(script)
  if not ok:
    return None
  _SERVER.address()
  env = os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
  return _jax_differences(_BASE_ENV, dict(env))


class Popen(_ORIGINAL_POPEN):
  """subprocess.Popen, forking from the server where it can (module doc)."""

  _zygote = None  # the connection the exit status arrives on

  def _execute_child(
    self,
    args,
    executable,
    preexec_fn,
    close_fds,
    pass_fds,
    cwd,
    env,
    startupinfo,
    creationflags,
    shell,
    p2cread,
    p2cwrite,
    c2pread,
    c2pwrite,
    errread,
    errwrite,
    restore_signals,
    gid,
    gids,
    uid,
    umask,
    start_new_session,
    process_group,
  ):
    options = _forkable(
      args,
      executable,
      preexec_fn,
      pass_fds,
      env,
      shell,
      gid,
      gids,
      uid,
      umask,
      start_new_session,
      process_group,
      cwd,
    )
    if options is None:
      return super()._execute_child(
        args,
        executable,
        preexec_fn,
        close_fds,
        pass_fds,
        cwd,
        env,
        startupinfo,
        creationflags,
        shell,
        p2cread,
        p2cwrite,
        c2pread,
        c2pwrite,
        errread,
        errwrite,
        restore_signals,
        gid,
        gids,
        uid,
        umask,
        start_new_session,
        process_group,
      )
    request = {
      "argv": [os.fsdecode(a) for a in args[1:]],
      "cwd": os.path.abspath(os.fsdecode(cwd) if cwd else os.getcwd()),
      "env": dict(
        os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
      ),
      "jax": options,
    }
    fds = [
      p2cread if p2cread != -1 else 0,
      c2pwrite if c2pwrite != -1 else 1,
      errwrite if errwrite != -1 else 2,
    ]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(_SERVER.address())
    socket.send_fds(conn, [json.dumps(request).encode()], fds)
    reply = conn.recv(_STATUS.size)
    if len(reply) != _STATUS.size:
      conn.close()
      raise OSError("the test process server closed the connection")
    self.pid = _STATUS.unpack(reply)[0]
    self._zygote = conn
    self._child_created = True
    self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

  def _zygote_waitpid(self, pid, flags):
    """os.waitpid for a forked child: its status comes from the server."""
    conn = self._zygote
    if flags & os.WNOHANG and not select.select([conn], [], [], 0)[0]:
      return 0, 0
    reply = conn.recv(_STATUS.size)
    conn.close()
    if len(reply) != _STATUS.size:
      raise ChildProcessError("the test process server went away")
    return pid, _STATUS.unpack(reply)[0]

  def _internal_poll(self, *args, **kwargs):
    # (Its parameters differ between Python versions: passed on as they come.)
    if self._zygote is None:
      return super()._internal_poll(*args, **kwargs)
    if self.returncode is None and self._zygote.fileno() != -1:
      if not self._waitpid_lock.acquire(False):
        return None
      try:
        if self.returncode is None:
          pid, sts = self._zygote_waitpid(self.pid, os.WNOHANG)
          if pid == self.pid:
            self._handle_exitstatus(sts)
      finally:
        self._waitpid_lock.release()
    return self.returncode

  def _try_wait(self, wait_flags):
    if self._zygote is None:
      return super()._try_wait(wait_flags)
    if self._zygote.fileno() == -1:
      return self.pid, 0
    return self._zygote_waitpid(self.pid, wait_flags)


# The Pythons whose private Popen._execute_child parameters and
# _internal_poll/_try_wait contracts Popen above was written against (their
# signature is checked too): on any other, every command is a new interpreter.
PYTHONS = ((3, 11), (3, 12), (3, 13))
_EXECUTE_CHILD_PARAMETERS = 23
# COMPRESSIVE_TEST_ZYGOTE=0 turns the server off: every command a new
# interpreter, as without this module.
SWITCH = "COMPRESSIVE_TEST_ZYGOTE"


def usable() -> bool:
  """Whether this interpreter can fork commands from the server: the switch
  is on, the Python is one of PYTHONS, and Popen's private method has the
  parameters Popen above overrides."""
  import inspect

  if os.environ.get(SWITCH, "1").lower() in _FALSE:
    return False
  if sys.version_info[:2] not in PYTHONS:
    return False
  parameters = inspect.signature(_ORIGINAL_POPEN._execute_child).parameters
  return len(parameters) - 1 == _EXECUTE_CHILD_PARAMETERS  # (less self)


def install() -> bool:
  """Every `subprocess.Popen` (and so `subprocess.run`) of this process from now
  on forks from the server where it can (`usable()`); whether it is installed."""
  if not usable():
    return False
  import jax  # noqa: F401  # it sets variables of its own

  _BASE_ENV.clear()
  _BASE_ENV.update(os.environ)
  subprocess.Popen = Popen
  return True


if __name__ == "__main__":
  serve(sys.argv[1])
