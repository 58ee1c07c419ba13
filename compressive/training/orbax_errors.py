"""Orbax's failures, told once: the OS error of a write the disk refused
(which Orbax and TensorStore report from their threads inside a message),
and the unraisable exceptions Orbax leaves behind after a failure that the
caller already reports in one line."""

from __future__ import annotations

import errno
import inspect
import os
import re
import sys
from typing import Any, Callable, Optional

import orbax.checkpoint as ocp

WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)


def write_errno(e: BaseException) -> Optional[int]:
  """The OS error code of a write the disk refused (WRITE_ERRNOS), also when
  Orbax or TensorStore carry it in a message from their threads; None for
  any other error."""
  code = getattr(e, "errno", None)
  found = re.search(r"os_error_code='(\d+)'", str(e))
  if found:
    code = int(found.group(1))
  return code if code in WRITE_ERRNOS else None


def quiet_orbax_leftovers() -> None:
  """Drops two kinds of unraisable exception that Orbax leaves after a
  failure the caller already reports in one line; every other one still
  shows:

  - after a refused write, TensorStore still completes the other writes of
    that save and calls back into Orbax's event loop, which is closed by
    then: 'Event loop is closed' (CheckpointWriteError reports the write);
  - after a read that failed (a step rotated away under a reader, or
    damage), the reads of that restore's other shards are abandoned, and
    each coroutine prints its own error, or its GeneratorExit, when
    collected (the restore's retry or its error reports the read).
  """
  previous = sys.unraisablehook
  if getattr(previous, "_drops_orbax_leftovers", False):
    return
  sys.unraisablehook = _LeftoverDropper(previous)


def _leftover(unraisable: sys.UnraisableHookArgs) -> bool:
  e, obj = unraisable.exc_value, unraisable.object
  if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
    return True
  return (
    inspect.iscoroutine(obj)
    and "read" in obj.cr_code.co_name
    and obj.cr_code.co_filename.startswith(_ORBAX_DIR)
  )


class _LeftoverDropper:
  """The unraisable hook of quiet_orbax_leftovers: `previous` but for
  Orbax's leftovers; marked so that a second call does not wrap it again."""

  _drops_orbax_leftovers = True

  def __init__(self, previous: Callable[[Any], object]) -> None:
    self._previous = previous

  def __call__(self, unraisable: sys.UnraisableHookArgs) -> None:
    if not _leftover(unraisable):
      self._previous(unraisable)


_ORBAX_DIR = os.path.dirname(ocp.__file__)
