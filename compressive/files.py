"""Writing a file whole or not at all: the one way the package (and the
folders beside it) replaces a file.

`replacing(path)` gives a file object on a new temporary file beside `path`
(`PATH.tmpPID.RANDOM`, in the same folder, so that the rename stays on one
file system); when the block ends without an error the temporary file is
closed and renamed over `path` (os.replace), so that a crash at any moment
leaves the old file or the new one, never half of each. On any error it is
removed and `path` is left as it was.

The temporary file is created with O_CREAT | O_EXCL | O_NOFOLLOW: whatever
already holds its name (a link planted there, a FIFO, a stale file) is never
followed, opened or waited on; another name is tried instead. A link at
`path` itself is replaced, not followed (a rename replaces the name). A
write, flush or close the disk refuses (a full disk, whose OSError names no
file) names the temporary file, which begins with `path` (errors.naming).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from typing import IO, Any, Iterator

from compressive.errors import naming

_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
          | getattr(os, "O_CLOEXEC", 0))
_ATTEMPTS = 100


def _create_beside(path: str, mode: int) -> tuple[str, int]:
  """(name, descriptor) of a new, empty regular file beside `path`."""
  for _ in range(_ATTEMPTS):
    tmp = f"{path}.tmp{os.getpid()}.{secrets.token_hex(4)}"
    try:
      return tmp, os.open(tmp, _FLAGS, mode)
    except FileExistsError:  # something holds the name: never opened, try another
      continue
  raise FileExistsError(errno.EEXIST, f"no free temporary name beside it after {_ATTEMPTS} tries",
                        path)


@contextlib.contextmanager
def replacing(path: str, *, binary: bool = False, mode: int = 0o666) -> Iterator[IO[Any]]:
  """A file object (text, UTF-8; bytes with `binary`) whose contents replace
  `path` at once when the block ends without an error; see the module's
  docstring. `mode` is the new file's permissions before the umask, as for
  open()."""
  tmp, fd = _create_beside(path, mode)
  try:
    with naming(tmp):
      with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
        fd = None  # the file object owns it now
        yield f
    os.replace(tmp, path)
  except BaseException:
    if fd is not None:
      os.close(fd)
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


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
  they are not JSON (values.finite_or_null turns them into null)."""
  text = json.dumps(value, indent=2, allow_nan=False) + "\n"
  write_text(path, text)
