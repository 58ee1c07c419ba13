"""Errors that are the user's to fix: entry points print them as one line
`error: ...` and exit with code 2, before any expensive work where possible.
Anything else is a bug and keeps its traceback."""

import contextlib
import os
import signal
from typing import Any, Callable, Iterator, Optional


class UserError(Exception):
  """Base: a message naming the cause and what would fix it."""


class ConfigError(UserError, ValueError):
  """A config field (or override) that cannot work; names the field."""


class MeshError(ConfigError):
  """A mesh that does not fit the devices, or sizes that do not divide along
  its axes (a tool reading a saved config adds how to choose another)."""


class DoesNotFitError(ConfigError):
  """A config whose lower-bound size estimate exceeds a device's memory
  (config.check): `need` and `have` bytes per device. train.py refuses it
  as a bad config (exit 2); aot.py reports it as a target the step does not
  fit (exit 1), as it reports a compiled step that does not fit."""

  def __init__(self, message: str, need: int, have: int):
    super().__init__(message)
    self.need, self.have = need, have


class DataError(UserError, ValueError):
  """A corpus, file or document that cannot be read as asked; names it."""


class CheckpointError(UserError):
  """A checkpoint that cannot be restored; names its directory."""


class StorageError(UserError):
  """Cloud Storage could not be reached, or refused a read or a write."""


class NonFiniteError(RuntimeError):
  """Training produced a NaN or infinite loss or gradient: not the user's
  error, but reported as one line (exit code 1), naming the newest intact
  checkpoint."""


EXIT_USER_ERROR = 2


# The signals that ask a process to stop, as terminals and schedulers send
# them: SIGTERM (preemption, kill, Kubernetes, systemd), SIGINT (Ctrl-C),
# SIGHUP (a closed terminal or SSH session), SIGUSR1 and SIGUSR2 (SLURM's
# --signal, Grid Engine's warnings), SIGXCPU (a CPU-time limit). Each is a
# stop: a trainer checkpoints and exits with exit_status; another tool
# stops with one line and the same status.
STOP_SIGNALS = (
  signal.SIGTERM,
  signal.SIGINT,
  signal.SIGHUP,
  signal.SIGUSR1,
  signal.SIGUSR2,
  signal.SIGXCPU,
)


def exit_status(signum: Optional[int]) -> int:
  """A run stopped by a signal exits with 128 + its number (143 for SIGTERM,
  130 for SIGINT), as a shell reports a process the signal ended, so that a
  retry loop or a job controller tells it from a finished run (0), a
  failure (1) and a refused command line (2, EXIT_USER_ERROR). A process
  that stopped with the others on a preemption notice it did not receive
  itself (JAX's preemption service) reports SIGTERM, the notice's signal."""
  return 128 + int(signum if signum is not None else signal.SIGTERM)


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
  """A failed write (a full disk) names the file: Python's own error for a
  write, flush or close of an open file does not."""
  try:
    yield
  except OSError as e:
    if e.filename is not None or e.errno is None:
      raise
    raise OSError(e.errno, e.strerror or os.strerror(e.errno), path) from e


class Stopped(KeyboardInterrupt):
  """A stop signal (STOP_SIGNALS) heard by a tool that holds no run to save."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def stopping_on_signals(
  main: Callable[[Any], Any], fail: Callable[..., Any]
) -> Callable[[Any], Any]:
  """main, with each stop signal a stop: where the tool installed no handler
  of its own (train.py holds them, then checkpoints), the signal raises
  Stopped wherever main is, its `with` blocks end (a mirror's folder is
  removed), and fail(line, code=exit_status) reports it in one line. The
  handlers main found are put back when it ends."""

  def run(argv: Any) -> Any:
    installed = {}
    for signum in STOP_SIGNALS:
      if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
        installed[signum] = signal.signal(signum, _raise_stopped)
    try:
      return main(argv)
    except Stopped as e:
      fail(f"stopped by {signal.Signals(e.signum).name}", code=exit_status(e.signum))
    finally:
      for signum, handler in installed.items():
        signal.signal(signum, handler)

  return run


def _raise_stopped(signum: int, frame: Any) -> None:
  del frame
  raise Stopped(signum)
