"""The side files of a workdir: config.json, train.log, the metrics files and
TensorBoard's folders. Only checkpoints decide where a run resumes, so
nothing in a side file's place may stop one (docs/LONG_RUNS.md, "Side files
never block a resume").

A side file is only ever opened when it is a regular file: never followed
through a link (which may lead out of the workdir), never opened when it is
a folder, and never a FIFO or a device, whose open() or read() can wait
forever (each open is non-blocking and checked with fstat before it is
used). It is only read up to a bound. The trainer sets anything else in a
side file's place aside (`NAME.aside`, with a one-line warning) before it
writes there; a reader, which never writes, refuses it in one line.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from typing import Iterator, Optional

from compressive.errors import CheckpointError

_log = logging.getLogger("compressive")

# Files a trainer writes in its workdir, and the folders it writes into.
FILES = ("config.json", "train.log", "metrics_train.jsonl", "metrics_eval.jsonl")
FOLDERS = ("tensorboard", os.path.join("tensorboard", "train"),
           os.path.join("tensorboard", "eval"))

# The most of a side file ever read: a config is a few KB; a metrics file
# gains ~300 bytes a logged step (a million steps logged is ~300 MB).
CONFIG_BYTES = 16 << 20
METRICS_BYTES = 2 << 30

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class NotAFileError(CheckpointError):
  """A side file's path holds something other than a regular file (a
  folder, a link, a FIFO, a device) or a file beyond the bound read."""

  def __init__(self, path: str, what: str):
    super().__init__(f"{path} is {what}")
    self.path, self.what = path, what


def kind(path: str) -> Optional[str]:
  """What `path` holds, not following a link: None (nothing), "file" (a
  regular file) or a description of anything else ("a folder, not a file")."""
  try:
    mode = os.lstat(path).st_mode
  except FileNotFoundError:
    return None
  return _describe(mode)


def _describe(mode: int) -> str:
  if stat.S_ISREG(mode):
    return "file"
  for test, what in ((stat.S_ISLNK, "a link"), (stat.S_ISDIR, "a folder"),
                     (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                     (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
    if test(mode):
      return what
  return "not a regular file"


def set_aside(path: str, why: str) -> str:
  """Renames `path` (whatever it is) to the first free `path.aside[.N]` and
  warns in one line; the new name."""
  target, n = path + ".aside", 0
  while os.path.lexists(target):
    n += 1
    target = f"{path}.aside.{n}"
  os.replace(path, target)
  _log.warning("%s is %s; set aside as %s", path, why, target)
  return target


def prepare(workdir: str) -> None:
  """Before a trainer writes in `workdir`: each side file's place holds a
  regular file or nothing, each side folder's a folder (not a link) or
  nothing; anything else is set aside."""
  for name in FILES:
    path = os.path.join(workdir, name)
    what = kind(path)
    if what not in (None, "file"):
      set_aside(path, f"{what}, not a file")
  for name in FOLDERS:
    path = os.path.join(workdir, name)
    what = kind(path)
    if what not in (None, "a folder"):
      set_aside(path, f"{'a file' if what == 'file' else what}, not a folder")


def open_regular(path: str, flags: int, mode: int = 0o644) -> int:
  """os.open(path, flags) of a regular file only: a link is not followed,
  and a FIFO or device is never waited on (the open is non-blocking and
  checked with fstat). NotAFileError for anything else; the descriptor is
  blocking again."""
  try:
    fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
  except OSError as e:
    what = kind(path)
    if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) and what not in (None, "file"):
      raise NotAFileError(path, f"{what}, not a file") from None
    raise
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise NotAFileError(path, f"{_describe(st.st_mode)}, not a file")
    if _NONBLOCK:
      os.set_blocking(fd, True)
  except BaseException:
    os.close(fd)
    raise
  return fd


def read_bytes(path: str, limit: int) -> bytes:
  """The bytes of the regular file `path`, refused (NotAFileError) when it
  holds more than `limit`."""
  fd = open_regular(path, os.O_RDONLY)
  with os.fdopen(fd, "rb") as f:
    data = f.read(limit + 1)
  if len(data) > limit:
    raise NotAFileError(path, f"larger than the {limit >> 20} MiB read of it")
  return data


@contextlib.contextmanager
def lines(path: str, limit: int) -> Iterator[Iterator[str]]:
  """The lines of the regular file `path` (text, undecodable bytes
  replaced), streamed; NotAFileError when it holds more than `limit` bytes."""
  fd = open_regular(path, os.O_RDONLY)
  with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
    size = os.fstat(f.fileno()).st_size
    if size > limit:
      raise NotAFileError(path, f"larger than the {limit >> 20} MiB read of it")
    yield f
