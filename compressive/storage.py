"""Calls to a store that may never answer, and the local folders that stand
for a store's run (compressive/remote.py's mirrors and uploads).

`within(seconds, what, call)`: the call runs in a thread of its own while
the caller waits in short slices, so that a signal's handler runs while it
waits (a second SIGTERM or Ctrl-C stops at once), and a call that has not
answered when its deadline passes is an error (`StorageTimeout`, one line)
instead of a hang: a Cloud Storage server that stops answering, or
TensorStore waiting for credentials it will never get. The thread is left
behind, a daemon: nothing waits for it at exit. After one call went
unanswered the store is taken as gone for the rest of the process
(`stalled`): later calls to it end at once with the same error, so that
the saves and copies an ending tool still tries never add a deadline each.

`LocalFolder`: a new folder in the temporary directory for a mirror or an
upload, held (an flock on a file beside what it holds) while its tool
runs and removed when it ends. A tool that a signal or `kill -9` ended
removes nothing; the next one clears every such folder no process holds
(`clear_left_behind`), as the OS released the lock of the one that died.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Callable, Optional, TypeVar

from compressive.errors import UserError

T = TypeVar("T")

# Seconds a call to Cloud Storage may go unanswered (a pull, a push, a
# checkpoint's save or the wait for one), unless the tool's
# --storage_deadline says otherwise.
DEFAULT_DEADLINE_S = 300.0
# How often the waiting thread wakes (signals run then).
_SLICE_S = 0.2
# How often a wait with `progress` says that it still waits.
PROGRESS_S = 10.0

_stalled: list[str] = []  # what went unanswered in this process (its first)


class StorageTimeout(UserError):
  """A call to a store did not answer within its deadline."""


def stalled() -> Optional[str]:
  """The first call that went unanswered in this process, or None."""
  return _stalled[0] if _stalled else None


def within(
  seconds: Optional[float],
  what: str,
  call: Callable[[], T],
  progress: Optional[Callable[[float], None]] = None,
) -> T:
  """call(), waited for at most `seconds` (None: no deadline, called here);
  StorageTimeout naming `what` when it has not answered by then, or when a
  call of this process went unanswered before (`stalled`). Its own
  exception is raised here. `progress(seconds waited)` is called every
  PROGRESS_S while it waits (a tool's start says so: no network, a server
  that does not answer)."""
  if seconds is None:
    return call()
  if _stalled:
    raise StorageTimeout(f"{what}: not tried, Cloud Storage stopped answering ({_stalled[0]})")
  outcome: dict[str, object] = {}

  def run() -> None:
    try:
      outcome["value"] = call()
    except BaseException as e:  # handed to the caller
      outcome["error"] = e

  thread = threading.Thread(target=run, name="compressive-storage", daemon=True)
  start = time.monotonic()
  end, said = start + seconds, start
  thread.start()
  while thread.is_alive():
    thread.join(_SLICE_S if progress is None else min(_SLICE_S, PROGRESS_S))  # signals run between
    now = time.monotonic()
    if thread.is_alive() and progress is not None and now - said >= PROGRESS_S and now < end:
      said = now
      progress(now - start)
    if thread.is_alive() and now >= end:
      _stalled.append(f"{what}: no answer within {seconds:g} s")
      raise StorageTimeout(
        f"{what}: Cloud Storage did not answer within {seconds:g} s "
        "(--storage_deadline); what was saved before is intact"
      )
  if "error" in outcome:
    raise outcome["error"]  # type: ignore[misc]
  return outcome["value"]  # type: ignore[return-value]


def exit_now(code: object) -> None:
  """Ends the process with `code` now, its output flushed: no wait at exit
  for threads (a storage client's, TensorStore's) that will never finish."""
  logging.shutdown()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(code if isinstance(code, int) else (0 if code is None else 1))


# -- Local folders standing for a store's. ------------------------------------------

_LOCK = "holder.lock"


class LocalFolder:
  """A new folder `path` (in PARENT/name, PARENT a new folder of the
  temporary directory named `prefix`...) held while open; `close` removes
  it. Every such folder of `prefix` that no process holds is removed first."""

  def __init__(self, prefix: str, name: str):
    clear_left_behind(prefix)
    self.parent = os.path.realpath(tempfile.mkdtemp(prefix=prefix))
    self._fd: Optional[int] = os.open(
      os.path.join(self.parent, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    self.path = os.path.join(self.parent, name)
    os.mkdir(self.path)

  def close(self) -> None:
    shutil.rmtree(self.parent, ignore_errors=True)
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


def temporary_folder() -> str:
  """Where the local folders go (Python's temporary directory: $TMPDIR)."""
  return tempfile.gettempdir()


def clear_left_behind(prefix: str) -> list[str]:
  """Removes the folders of the temporary directory named `prefix`... that
  a LocalFolder made and no process holds (its holder ended without removing
  it: a signal, kill -9); the folders removed. One whose lock cannot be
  opened (another user's) is left alone."""
  removed = []
  for parent in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), prefix + "*")):
    lock = os.path.join(parent, _LOCK)
    try:
      fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
      continue  # not one of ours (no lock file), or not ours to open
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      continue  # held: a running tool's
    finally:
      os.close(fd)
    shutil.rmtree(parent, ignore_errors=True)
    removed.append(parent)
  return removed
