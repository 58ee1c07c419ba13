"""One trainer per workdir, one run per checkpoints folder: advisory locks
that the OS releases when the holder dies.

`train.py` (process 0 of a multi-host run) takes exclusive `flock`s on three
things before it reads or writes anything else in the workdir, and keeps
them until it exits:

- the workdir folder itself, opened as a folder: every name of it (a link to
  it, a bind mount of it) is the same lock, and no file a user can delete
  holds it, so deleting `train.lock` while a trainer runs does not let a
  second one in;
- its checkpoints folder (created if missing, followed if it is a link, so
  that checkpoints can live on another disk): a checkpoints folder belongs
  to one run, and a second workdir whose `checkpoints/` is the same folder
  (a link or a bind mount) is refused while that run trains; after it, too:
  the folder records the workdir whose run it holds (`workdir.json`: the
  workdir folder's device and inode), and another workdir is refused unless
  its checkpoints are a plain subfolder of its own (a workdir copied or
  moved whole); a `checkpoints` that is the workdir itself is refused;
- `WORKDIR/train.lock`, the record a person reads (the holder's PID and
  host), which is also the lock that trainers of earlier versions take. It
  is never followed: anything in its place but a file of its own (a
  symbolic link, a hard link to a file elsewhere, a folder, a FIFO) is
  renamed aside, unopened, to `train.lock.set-aside-N` with a warning, and a
  new file takes its place.

A second trainer stops with one line naming the holder's PID and host (from
the kernel's lock table, /proc/locks, or else from train.lock) before any
work. A process that dies, even by SIGKILL, releases its locks with its file
descriptors, so a killed run resumes without any clean-up. Readers (eval.py,
sample.py, analyze.py, compressive.load) take no lock.

On NFS (not tested here), Linux implements `flock` on files with the
server's byte-range locks (NFSv4, or the lock manager of NFSv3), so
train.lock keeps trainers on different hosts apart; a folder's `flock` there
is the client's own, so the folder locks may keep out only trainers on the
same host, and deleting train.lock during a run may let a trainer on
another host in. A filesystem that cannot lock a folder makes the run say
that only train.lock keeps a second trainer out; one that supports no
locking at all makes `flock` fail with ENOLCK or EOPNOTSUPP, and training
then goes on with a warning that nothing stops a second trainer.

On Cloud Storage (a gs:// workdir, compressive/remote.py) there is no lock
at all, and no owner record: the run says so in its log, and keeping a
second trainer out is the job controller's.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
from typing import Optional

from compressive import files
from compressive.errors import UserError
from compressive.training import interrupts, layout, savedjson

# The names this module opens relative to the workdir folder (layout.py's).
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
# What flock says where a filesystem cannot lock (EBADF and EINVAL: NFS's
# emulation, asked to write-lock a folder that is open only for reading).
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EINVAL)
_log = logging.getLogger("compressive")


class WorkdirBusyError(UserError):
  """Another trainer holds the workdir's lock, or its checkpoints folder's."""


class WorkdirLock:
  """Exclusive, advisory, released on `release()` or when the process dies."""

  def __init__(self, workdir: str):
    self.workdir = os.path.abspath(workdir)
    self.layout = layout.Workdir(self.workdir)
    self.path = self.layout.lock
    self._fds: list[int] = []

  def acquire(self) -> "WorkdirLock":
    try:
      self._acquire()
    except BaseException:
      self.release()  # a refusal keeps nothing locked
      raise
    return self

  def _acquire(self) -> None:
    folder = self._open(self.workdir, os.O_RDONLY | os.O_DIRECTORY)
    folder_locked = _flock(folder)
    if folder_locked is False:
      raise WorkdirBusyError(self._busy(folder, folder))
    record = self._open_record(folder)
    record_locked = _flock(record)
    if record_locked is False:  # held by a trainer of an earlier version
      raise WorkdirBusyError(self._busy(record, folder))
    if folder_locked is None:
      _log.warning(
        "cannot lock the folder %s on this filesystem: %s",
        self.workdir,
        "only its train.lock keeps a second trainer out, so do not delete it while this run trains"
        if record_locked
        else "it has no file locks, so nothing stops a second trainer on the same workdir",
      )
    self._lock_checkpoints(folder)
    os.ftruncate(record, 0)
    os.pwrite(record, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
    os.fsync(record)

  def _open(self, name: str, flags: int, *, dir_fd: Optional[int] = None, mode: int = 0o644) -> int:
    fd = os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    self._fds.append(fd)
    return fd

  def _open_record(self, folder: int) -> int:
    """train.lock, a regular file with no other name, opened without
    following anything; whatever else is in its place is set aside first."""
    for _ in range(3):
      try:
        st = os.stat(layout.LOCK_FILE, dir_fd=folder, follow_symlinks=False)
      except FileNotFoundError:
        st = None
      if st is not None and not _own_file(st):
        _set_aside(folder, self.path, st)
        continue
      try:
        fd = self._open(
          layout.LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder
        )
      except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
          continue  # replaced between the look and the open: look again
        raise
      if _own_file(os.fstat(fd)):
        return fd
    raise UserError(
      f"{self.path} keeps being replaced by something that is not a file while "
      f"the trainer takes its lock; leave it alone and start again"
    )

  def _lock_checkpoints(self, folder: int) -> None:
    path = self.layout.checkpoints
    try:
      os.mkdir(layout.CHECKPOINT_DIR, dir_fd=folder)
    except FileExistsError:
      pass
    try:
      fd = self._open(layout.CHECKPOINT_DIR, os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
    except (FileNotFoundError, NotADirectoryError) as e:
      what = (
        f"a link to {os.readlink(path)}, which does not exist"
        if isinstance(e, FileNotFoundError) and os.path.islink(path)
        else "not a folder"
      )
      raise UserError(
        f"{path} is {what}: the checkpoints must go into a folder (move it "
        f"away, or make it a link to a folder)"
      ) from None
    real = os.path.realpath(path)
    name = path if real == path else f"{path} (which is {real})"
    if _same_file(os.fstat(fd), os.fstat(folder)):
      raise UserError(
        f"{name} is the workdir itself: the checkpoints must go into a folder of "
        f"their own (remove the link, or make it a link to another folder)"
      )
    if _flock(fd) is False:
      raise WorkdirBusyError(
        f"{name} is the checkpoints folder of another trainer ({self._holder(fd, None)}); "
        f"a checkpoints folder belongs to one run: give this run a workdir with "
        f"checkpoints of its own, or wait for that run to finish"
      )
    self._claim_checkpoints(folder, fd, name)

  def _claim_checkpoints(self, folder: int, checkpoints: int, name: str) -> None:
    """The checkpoints folder's record of the workdir whose run it holds
    (layout.OWNER_FILE: the workdir folder's device and inode, and its path then),
    written when missing or out of date. A record of another workdir is
    refused unless the checkpoints folder is a plain subfolder of this one
    (the workdir was copied or moved, checkpoints and all): a link or a
    mount that leads to another run's checkpoints is never resumed."""
    here = os.fstat(folder)
    mine = {"device": here.st_dev, "inode": here.st_ino, "workdir": self.workdir}
    record_path = self.layout.owner
    record = _read_owner(record_path)
    if record == mine:
      return
    if (
      record is not None
      and (record.get("device"), record.get("inode")) != (here.st_dev, here.st_ino)
      and not _subfolder(folder, checkpoints)
    ):
      raise UserError(
        f"{name} holds the run of another workdir ({record.get('workdir')}); a checkpoints "
        f"folder belongs to one run: give this workdir checkpoints of its own (if it is that "
        f"run's workdir, moved or copied, remove {os.path.realpath(record_path)})"
      )
    files.write_json(record_path, mine)

  def _busy(self, fd: int, folder: int) -> str:
    return (
      f"{self.workdir} is in use by another trainer ({self._holder(fd, folder)}); wait "
      f"for it to finish or stop it, or use another --workdir (the lock goes with that "
      f"process: deleting {layout.LOCK_FILE} does not free it)"
    )

  def _holder(self, fd: int, folder: Optional[int]) -> str:
    pid = _locking_pid(fd)
    if pid is not None:
      return f"pid {pid} on host {socket.gethostname()}"
    return (_read_record(folder) if folder is not None else "") or "holder unknown"

  def release(self) -> None:
    # train.lock stays: removing it would race with a trainer that has it open.
    while self._fds:
      fd = self._fds.pop()
      try:
        fcntl.flock(fd, fcntl.LOCK_UN)
      except OSError:
        pass  # never locked (a refusal, or a filesystem without locks)
      os.close(fd)

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc: object) -> None:
    self.release()


def _flock(fd: int) -> Optional[bool]:
  """True: locked; False: another holds it; None: this filesystem cannot."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno in _BUSY:
      return False
    if e.errno in _UNSUPPORTED:
      return None
    raise
  return True


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
  return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _subfolder(folder: int, checkpoints: int) -> bool:
  """Whether the workdir's checkpoints entry is a folder (not a link) whose
  parent is the workdir (`folder`): the workdir's own, wherever it came from."""
  try:
    entry = os.stat(layout.CHECKPOINT_DIR, dir_fd=folder, follow_symlinks=False)
    parent = os.stat("..", dir_fd=checkpoints)
  except OSError:
    return False
  return (
    stat.S_ISDIR(entry.st_mode)
    and _same_file(entry, os.fstat(checkpoints))
    and _same_file(parent, os.fstat(folder))
  )


def _read_owner(path: str) -> Optional[dict]:
  """The checkpoints folder's owner record; None when there is none, or
  none that can be read (damage is written over: the record only tells
  runs apart, and the workdir that holds the lock claims the folder)."""
  try:
    record = savedjson.read(path, dict, 1 << 16)
  except (OSError, UserError) as e:
    if not isinstance(e, FileNotFoundError):
      _log.warning("%s cannot be read (%s); this workdir claims the checkpoints folder", path, e)
    return None
  return record


def _own_file(st: os.stat_result) -> bool:
  """A regular file with no name outside the workdir (no other hard link)."""
  return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _kind(st: os.stat_result) -> str:
  mode = st.st_mode
  if stat.S_ISLNK(mode):
    return "a symbolic link"
  if stat.S_ISDIR(mode):
    return "a folder"
  if stat.S_ISREG(mode):
    return f"a file with {st.st_nlink} names (a hard link)"
  if stat.S_ISFIFO(mode):
    return "a FIFO"
  return "not a regular file"


def _set_aside(folder: int, path: str, st: os.stat_result) -> None:
  """Renames what is at `path` (unopened: a link's target is never touched)."""
  for n in range(1, 1000):
    name = layout.set_aside_lock(n)
    try:
      os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
      os.rename(layout.LOCK_FILE, name, src_dir_fd=folder, dst_dir_fd=folder)
      _log.warning(
        "%s was %s, not a lock file of its own: set aside as %s, unopened, and "
        "replaced by a new one",
        path,
        _kind(st),
        name,
      )
      return
  raise UserError(
    f"{path} is {_kind(st)} and 999 earlier ones were set aside beside it: "
    f"remove the {layout.set_aside_lock('*')} entries of {os.path.dirname(path)}"
  )


def _locking_pid(fd: int) -> Optional[int]:
  """The process that holds a flock on fd's file, from /proc/locks (Linux;
  None elsewhere, for a holder on another host, or one this process cannot
  see). Lines read `N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF`, the
  device numbers in hex; waiters' lines carry a `->`."""
  st = os.fstat(fd)
  want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
  try:
    with open("/proc/locks", encoding="ascii", errors="replace") as f:
      lines = f.read(1 << 20).splitlines()
  except OSError:
    return None
  for line in lines:
    parts = line.split()
    if len(parts) < 6 or parts[1] != "FLOCK":
      continue
    try:
      major, minor, inode = parts[5].split(":")
      if (int(major, 16), int(minor, 16), int(inode)) == want and int(parts[4]) > 0:
        return int(parts[4])
    except ValueError:
      continue
  return None


def _read_record(folder: int) -> str:
  """train.lock's first line, when it is a file of its own ("" otherwise)."""
  try:
    if not _own_file(os.stat(layout.LOCK_FILE, dir_fd=folder, follow_symlinks=False)):
      return ""
    fd = os.open(
      layout.LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
    )
    try:
      text = os.pread(fd, 200, 0) if _own_file(os.fstat(fd)) else b""
    finally:
      os.close(fd)
  except OSError:
    return ""
  lines = text.decode("utf-8", "replace").strip().splitlines()
  return lines[0].strip() if lines else ""


def lock_workdir(workdir: layout.Where, is_main: bool) -> Optional[WorkdirLock]:
  """Process 0 takes the workdir's lock; every process learns whether it
  could. A workdir on Cloud Storage (the local mirror of one, remote.py)
  has no lock: that is said in the log, and None returned."""
  lock, busy = None, None
  run = layout.workdir(workdir)
  url = run.url
  if url is not None:
    if is_main:
      _log.info(
        "%s is on Cloud Storage, which has no lock: nothing keeps a second trainer out "
        "of it (docs/SCALING.md)",
        url,
      )
    return None
  if is_main:
    try:
      lock = WorkdirLock(run.root).acquire()
    except UserError as e:  # busy, or a checkpoints path that is no folder
      busy = e
  if interrupts.agree(busy is not None):
    raise busy or WorkdirBusyError(f"process 0 could not lock {run.root}; its log names why")
  return lock
