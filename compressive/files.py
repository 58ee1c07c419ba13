"""Writing a file whole or not at all: the one way the package (and the
folders beside it) replaces a file; and reading one within a bound: the one
way a file the package did not just write is opened.

`replacing(path)` gives a file object on a new temporary file beside `path`
(`PATH.tmpPID.RANDOM`, in the same folder, so that the rename stays on one
file system); when the block ends without an error the temporary file is
synced to disk (fsync), closed and renamed over `path` (os.replace), and the
folder synced, so that a crash at any moment, a power cut too, leaves the
old file or the new one, never half of each. On any error it is removed and
`path` is left as it was.

The temporary file is created with O_CREAT | O_EXCL | O_NOFOLLOW: whatever
already holds its name (a link planted there, a FIFO, a stale file) is never
followed, opened or waited on; another name is tried instead. A link at
`path` itself is replaced, not followed (a rename replaces the name). A
write, flush or close the disk refuses (a full disk, whose OSError names no
file) names the temporary file, which begins with `path` (errors.naming).

`open_regular(path)` and `read_bytes(path, limit)` open a regular file only:
a folder, a FIFO or a device (/dev/zero, whose read never ends) is refused
in one line (NotAFileError), never waited on (the open is non-blocking and
checked with fstat before it is used), and never read past `limit`. A file a
run or an export holds is never read through a link (a link may lead out of
the folder, to anything); a file a user names on the command line (a prompt,
a tokenizer) is, with `follow=True`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
from typing import IO, Any, Iterator, Optional

from compressive import remote
from compressive.errors import CheckpointError, ConfigError, naming

# `scheme://` begins a URL (gs://, s3://, http://): os.path would take
# `gs://b/x` for the local folder `gs:/b/x`, so a URL is never a local path;
# the package works in runs and exports on gs:// through compressive/remote.py.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: Any) -> bool:
  """Whether `path` begins with `scheme://` (a URL, never a local path)."""
  return isinstance(path, str) and bool(_URL.match(path))


def check_local(path: Any, what: str, *, remote_ok: bool = False) -> None:
  """ConfigError unless `path` (a workdir, an export, a prompt file: `what`)
  names a place on this machine's file system, or (with `remote_ok`) a URL
  of a store the package works in (remote.SCHEMES: gs://)."""
  if isinstance(path, str) and _URL.match(path):
    scheme = path.split("://", 1)[0]
    if remote_ok and scheme in remote.SCHEMES:
      remote.check_url(path, what)
      return
    where = (
      "give a path on this machine's file system or a gs:// URL"
      if remote_ok
      else "give a path on this machine's file system"
    )
    raise ConfigError(f"{path}: {what} on {scheme}:// is not supported; {where} (docs/SCALING.md)")


_FLAGS = (
  os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)
_ATTEMPTS = 100


def _create_beside(path: str, mode: int) -> tuple[str, int]:
  """(name, descriptor) of a new, empty regular file beside `path`."""
  for _ in range(_ATTEMPTS):
    tmp = f"{path}.tmp{os.getpid()}.{secrets.token_hex(4)}"
    try:
      return tmp, os.open(tmp, _FLAGS, mode)
    except FileExistsError:  # something holds the name: never opened, try another
      continue
  raise FileExistsError(
    errno.EEXIST, f"no free temporary name beside it after {_ATTEMPTS} tries", path
  )


@contextlib.contextmanager
def replacing(path: str, *, binary: bool = False, mode: int = 0o666) -> Iterator[IO[Any]]:
  """A file object (text, UTF-8; bytes with `binary`) whose contents replace
  `path` at once when the block ends without an error; see the module's
  docstring. `mode` is the new file's permissions before the umask, as for
  open()."""
  fd: int | None
  tmp, fd = _create_beside(path, mode)
  try:
    with naming(tmp):
      with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
        fd = None  # the file object owns it now
        yield f
        f.flush()
        os.fsync(f.fileno())  # the contents on disk before the name points at them
    os.replace(tmp, path)
    _sync_folder(os.path.dirname(path) or ".")
  except BaseException:
    if fd is not None:
      os.close(fd)
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def _sync_folder(folder: str) -> None:
  """The rename on disk: the folder's entry is synced as its file's contents
  were. A file system that cannot sync a folder (EINVAL) keeps the rename
  as the kernel keeps it."""
  fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
  try:
    os.fsync(fd)
  except OSError as e:
    if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
      raise
  finally:
    os.close(fd)


def write_bytes(path: str, data: bytes) -> None:
  """Replaces `path` with `data`, whole or not at all."""
  with replacing(path, binary=True) as f:
    f.write(data)


def write_text(path: str, text: str) -> None:
  """Replaces `path` with `text` (UTF-8), whole or not at all."""
  with replacing(path) as f:
    f.write(text)


def write_json(path: str, value: Any) -> None:
  """Replaces `path` with `value` as indented JSON and a newline, whole or
  not at all. NaN and infinities are refused (ValueError, nothing written):
  they are not JSON (nested.finite_or_null turns them into null)."""
  text = json.dumps(value, indent=2, allow_nan=False) + "\n"
  write_text(path, text)


# -- Reading. ---------------------------------------------------------------------

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class NotAFileError(CheckpointError):
  """A path that holds something other than a regular file (a folder, a
  link, a FIFO, a device) or a file beyond the bound read; `path` and `what`
  for callers that word their own message."""

  def __init__(self, path: str, what: str):
    super().__init__(f"{path} is {what}")
    self.path, self.what = path, what


def kind(path: str, follow: bool = False) -> Optional[str]:
  """What `path` holds (through a link only with `follow`): None (nothing),
  "file" (a regular file) or a description of anything else ("a folder")."""
  try:
    mode = (os.stat if follow else os.lstat)(path).st_mode
  except (FileNotFoundError, NotADirectoryError):
    return None
  return describe(mode)


def describe(mode: int) -> str:
  """ "file" for a regular file's st_mode, else what it is ("a FIFO")."""
  if stat.S_ISREG(mode):
    return "file"
  for test, what in (
    (stat.S_ISLNK, "a link"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
  ):
    if test(mode):
      return what
  return "not a regular file"


def open_regular(path: str, flags: int, mode: int = 0o644, *, follow: bool = False) -> int:
  """os.open(path, flags) of a regular file only, through a link only with
  `follow`; NotAFileError for anything else (OSError as os.open raises it
  for a missing file). The descriptor is blocking again."""
  nofollow = 0 if follow else _NOFOLLOW
  try:
    fd = os.open(path, flags | nofollow | _NONBLOCK | _CLOEXEC, mode)
  except OSError as e:
    what = kind(path, follow)
    if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) and what not in (None, "file"):
      raise NotAFileError(path, f"{what}, not a file") from None
    raise
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise NotAFileError(path, f"{describe(st.st_mode)}, not a file")
    if _NONBLOCK:
      os.set_blocking(fd, True)
  except BaseException:
    os.close(fd)
    raise
  return fd


def _size(limit: int) -> str:
  return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def read_bytes(path: str, limit: int, *, follow: bool = False) -> bytes:
  """The bytes of the regular file `path` (open_regular), refused
  (NotAFileError) when it holds more than `limit`: its size is looked at
  before anything is read, and no more than `limit` + 1 bytes are read. A
  gs:// URL is read whole, within the same bound (compressive/remote.py)."""
  if remote.is_remote(path):  # a checkpoint's file on Cloud Storage: an object, never a link
    if remote.size(path) > limit:
      raise NotAFileError(path, f"larger than the {_size(limit)} read of it")
    return remote.read_bytes(path)
  fd = open_regular(path, os.O_RDONLY, follow=follow)
  with os.fdopen(fd, "rb") as f:
    if os.fstat(f.fileno()).st_size > limit:
      raise NotAFileError(path, f"larger than the {_size(limit)} read of it")
    data = f.read(limit + 1)
  if len(data) > limit:
    raise NotAFileError(path, f"larger than the {_size(limit)} read of it")
  return data
