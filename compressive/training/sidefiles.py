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
writes there; a reader, which never writes, refuses it in one line. A
side file with other names (a hard-linked copy of a workdir) is made a file
of its own before the trainer appends to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Callable, Iterator

from compressive import files, remote
from compressive.training import layout

_log = logging.getLogger("compressive")

# Files a trainer writes in its workdir, and the folders it writes into,
# relative to it (layout.py names them).

# The most of a side file ever read: a config is a few KB; a metrics file
# gains ~300 bytes a logged step (a million steps logged is ~300 MB).
CONFIG_BYTES = 16 << 20
METRICS_BYTES = 2 << 30

# What a mirror of a run on Cloud Storage copies from its top, by name, and
# the most of each it copies (compressive/remote.py): the side files and an
# export's manifest, each within its reader's bound (train.log, which the
# trainer appends to and nothing reads, within a metrics file's).
remote.register_run_files(
  {
    layout.CONFIG_FILE: CONFIG_BYTES,
    layout.EXPORT_FILE: CONFIG_BYTES,
    layout.LOG_FILE: METRICS_BYTES,
    **{layout.metrics_file(name): METRICS_BYTES for name in layout.METRICS},
  }
)


def set_aside(path: str, why: str, public: Callable[[str], str] = str) -> str:
  """Renames `path` (whatever it is) to the first free `path.aside[.N]` and
  warns in one line, naming the paths by `public` (layout.Workdir.public: a
  mirror's files by the URL); the new name."""
  target, n = layout.aside(path), 0
  while os.path.lexists(target):
    n += 1
    target = layout.aside(path, n)
  os.replace(path, target)
  _log.warning("%s is %s; set aside as %s", public(path), why, public(target))
  return target


def prepare(workdir: layout.Where) -> None:
  """Before a trainer writes in `workdir`: each side file's place holds a
  regular file or nothing, each side folder's a folder (not a link) or
  nothing; anything else is set aside, and so is a log larger than a
  metrics file's bound (a mirror copies no more of it: appended to, the
  part would replace the whole)."""
  run = layout.workdir(workdir)
  for path in run.side_files:
    what = files.kind(path)
    if what not in (None, "file"):
      set_aside(path, f"{what}, not a file", run.public)
    elif what == "file" and path == run.log and os.lstat(path).st_size > METRICS_BYTES:
      set_aside(path, f"larger than the {METRICS_BYTES >> 20} MiB a log is kept to", run.public)
    elif what == "file" and os.lstat(path).st_nlink > 1:
      unshare(path)
  for path in run.side_folders:
    what = files.kind(path)
    if what not in (None, "a folder"):
      set_aside(path, f"{'a file' if what == 'file' else what}, not a folder", run.public)


def unshare(path: str) -> None:
  """Makes the file at `path`, which has other names (a hard-linked copy of a
  workdir: `cp -al`, `rsync --link-dest`), a file of its own with the same
  bytes, so that appending to it never writes into the other workdir."""
  fd = files.open_regular(path, os.O_RDONLY)
  with os.fdopen(fd, "rb") as src, files.replacing(path, binary=True) as dst:
    shutil.copyfileobj(src, dst)
  _log.info("%s had other names (a hard-linked copy); it is now a file of its own", path)


@contextlib.contextmanager
def lines(path: str, limit: int) -> Iterator[Iterator[str]]:
  """The lines of the regular file `path` (text, undecodable bytes
  replaced), streamed; files.NotAFileError when it holds more than `limit` bytes."""
  fd = files.open_regular(path, os.O_RDONLY)
  with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
    size = os.fstat(f.fileno()).st_size
    if size > limit:
      raise files.NotAFileError(path, f"larger than the {limit >> 20} MiB read of it")
    yield f
