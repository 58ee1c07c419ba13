"""The environment's errors, not a bug: which OSErrors are a missing file,
a full disk, a read-only or unwritable path or a file where a folder should
be, and the one line that names each with its path (cli.user_errors prints
it as `error: ...`, exit code 2)."""

from __future__ import annotations

import errno
import os
from typing import Any, Optional

from compressive import remote

# OSErrors that are the environment's, not a bug: each is reported as one
# line naming the path. ENOENT (FileNotFoundError) is reported the same way.
_WRITE_ERRNOS = frozenset(
  getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG") if hasattr(errno, name)
)
ENVIRONMENT_ERRNOS = _WRITE_ERRNOS | frozenset(
  getattr(errno, name)
  for name in ("EACCES", "EPERM", "ENOTDIR", "EISDIR", "EEXIST", "ENAMETOOLONG", "ELOOP", "ENOENT")
  if hasattr(errno, name)
)


def _path(name: Any) -> str:
  return os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)


def _file_in_the_way(path: str) -> Optional[str]:
  """The path itself or its nearest existing ancestor, if that is not a folder."""
  current = os.path.abspath(path)
  while True:
    if os.path.lexists(current):
      return current if not os.path.isdir(current) else None
    parent = os.path.dirname(current)
    if parent == current:
      return None
    current = parent


def environment_error(e: Optional[BaseException]) -> Optional[OSError]:
  """e, or the nearest exception e was explicitly raised from, if it is an
  OSError of the environment (ENVIRONMENT_ERRNOS, or any FileNotFoundError)."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and (
      e.errno in ENVIRONMENT_ERRNOS or isinstance(e, FileNotFoundError)
    ):
      return e
    e = e.__cause__
  return None


def describe_os_error(error: BaseException) -> Optional[str]:
  """One line for an environment OSError (see environment_error); None when
  there is none (then it is a bug and keeps its traceback)."""
  e = environment_error(error)
  if e is None:
    return None
  if e.errno is None or e.filename is None:
    # Raised with a message of its own (FileNotFoundError(message)), or one
    # without a path: the message is all there is.
    text = str(e) or type(e).__name__
    if e.errno is None and remote.is_remote(text) and " " not in text:  # a storage client's
      return (
        f"{text}: not found on Cloud Storage (a workdir there has no lock: another "
        "process may have removed it)"
      )
    if e.errno is None:
      return text
    cause = e.strerror or os.strerror(e.errno)
    return f"cannot write: {cause}" if e.errno in _WRITE_ERRNOS else cause
  path = _path(e.filename)
  where = path if e.filename2 is None else f"{path} -> {_path(e.filename2)}"
  cause = e.strerror or os.strerror(e.errno)
  if e.errno in _WRITE_ERRNOS:
    return f"cannot write {where}: {cause}"
  if e.errno in (errno.EACCES, errno.EPERM):
    return f"cannot access {where}: {cause}"
  if e.errno == errno.ENOENT:
    return f"{where}: {cause}"
  hint = ""
  if e.errno in (errno.ENOTDIR, errno.EEXIST):
    blocker = _file_in_the_way(path)
    if blocker is not None:
      what = "it" if blocker == os.path.abspath(path) else blocker
      hint = f" ({what} is a file, not a folder)"
  elif e.errno == errno.EISDIR:
    hint = " (it is a folder, not a file)"
  return f"cannot use {where}: {cause}{hint}"
