"""One trainer per workdir: an advisory lock that the OS releases when the
holder dies.

`train.py` (process 0 of a multi-host run) takes an exclusive `flock` on
`WORKDIR/train.lock` before it reads or writes anything there, and keeps it
until it exits; a second trainer on the same workdir stops with one line
naming the holder's PID and host. A process that dies, even by SIGKILL,
releases the lock with its file descriptors, so a killed run resumes without
any clean-up. Readers (eval.py, sample.py, analyze.py, compressive.load) take
no lock.

On NFS, Linux implements `flock` with the server's byte-range locks (NFSv4,
or the lock manager of NFSv3), so trainers on different hosts exclude each
other too. A filesystem that supports no locking at all makes `flock` fail
with ENOLCK or EOPNOTSUPP: training then goes on with a warning that nothing
stops a second trainer.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from typing import Optional

from compressive.errors import UserError
from compressive.training import interrupts

LOCK_FILE = "train.lock"
_log = logging.getLogger("compressive")


class WorkdirBusyError(UserError):
  """Another trainer holds the workdir's lock."""


class WorkdirLock:
  """Exclusive, advisory, released on `release()` or when the process dies."""

  def __init__(self, workdir: str):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
    self._fd: Optional[int] = None

  def acquire(self) -> "WorkdirLock":
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        holder = _read(fd)
        os.close(fd)
        raise WorkdirBusyError(
            f"{os.path.dirname(self.path)} is in use by another trainer ({holder}); wait for "
            f"it to finish or stop it, or use another --workdir") from None
      if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        _log.warning("cannot lock %s (%s): this filesystem has no file locks, so nothing "
                     "stops a second trainer on the same workdir", self.path, e.strerror)
        os.close(fd)
        return self
      os.close(fd)
      raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
    os.fsync(fd)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is not None:
      # The file stays: removing it would race with a trainer that has it open.
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _read(fd: int) -> str:
  try:
    text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
  except OSError:
    text = ""
  return text or "holder unknown"


def lock_workdir(workdir: str, is_main: bool):
  """Process 0 takes the workdir's lock; every process learns whether it could."""
  lock, busy = None, None
  if is_main:
    try:
      lock = WorkdirLock(workdir).acquire()
    except WorkdirBusyError as e:
      busy = e
  if interrupts.agree(busy is not None):
    raise busy or WorkdirBusyError(
        f"{workdir} is in use by another trainer (process 0 could not lock it)")
  return lock
