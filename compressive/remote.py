"""Workdirs and exports on Cloud Storage (`gs://bucket/run`): a local mirror
of a run's small files, beside checkpoints and parameters that Orbax reads
and writes in the bucket itself.

A tool given a `gs://` workdir (each opens its own: layout.opened for a
workdir or an export, `Upload` for export.py's --output; `compressive.load`
and `train_and_evaluate` for their callers) works in a `Mirror`: a new
local folder into which the files at the top of the run's folder are
copied first (config.json, train.log, the metrics, the results, an
export's manifest; never a folder). The run's place is a value,
layout.Workdir, that carries the mirror: its checkpoints and an export's
parameters are named in the bucket, its messages name the URL
(`Workdir.public`), and a user's error that ends a tool's work in the
mirror names the URL where it named the local folder. Nothing here is held
by the process: two mirrors, or a mirror and a local run, live side by
side. The package's own file handling (the side files' checks,
the appends, the truncation on resume, the atomic writes) runs on local
files as for any workdir, and Orbax writes each checkpoint straight to
Cloud Storage through its own support (TensorStore), as on a TPU pod.

The bucket is read like a disk: a mirror copies only the files a run
writes at its top, by name (`register_run_files`: training/sidefiles.py
names them), each streamed to disk and no further than the bound its local
reader has, so a stray object of any name or size is never read, and an
oversized side file is found over its bound, as on a disk (the reader
refuses it, the trainer sets it aside: such a part-copy is never copied
back; the bucket's whole object is copied to the name it was set aside
as, in the bucket). What the tool changed or added in the mirror is
copied back (`push`), each file whole: after every checkpoint a trainer
saves (so the bucket's metrics reach at least the newest checkpoint's
step), and when the tool ends, by an error too. Every pull, push and
checkpoint save has a deadline (compressive/storage.py), and a mirror's
start reaches TensorStore too, with the credentials it will use: a store
that never answers is one line, not a hang. A new run that fails before
its first checkpoint leaves nothing in the bucket. An export written to a
URL (`Upload`) is made locally and copied there when complete, its
top-level files (the manifest) last.

What holds on Cloud Storage, and what does not (docs/SCALING.md):
- an object is replaced whole: a reader sees the old file or the new one,
  never part of each, as with files.replacing on a disk;
- a checkpoint is complete or ignored, as on a disk (Orbax marks a finished
  step with a commit file there, where a disk has the rename);
- there is no lock: nothing keeps a second trainer out of a workdir on
  Cloud Storage (lock.py says so in the log), and the checkpoints folder's
  owner record (a folder's device and inode) has no meaning there; a
  damaged step set aside (--restore_intact) is copied, then removed;
- a process killed without warning (SIGKILL, a lost VM) loses the side
  files' lines written since its last checkpoint, lines which a resume from
  that checkpoint drops anyway.

The path library is etils.epath: tf.io.gfile where TensorFlow is installed,
else fsspec's gcsfs (the `[gcs]` extra); the tests run against a Cloud
Storage server through gcsfs (tests/training/test_remote.py). Any error of
those clients (no network, no credentials, a refusal) is one line
(StorageError).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import IO, TYPE_CHECKING, Any, Iterator, Mapping, Optional

from compressive import reach, storage
from compressive.errors import ConfigError, StorageError, UserError

if TYPE_CHECKING:  # imported only where a URL is used (_epath)
  from etils import epath

# What the package reads and writes runs in; other URLs are refused
# (files.check_local).
SCHEMES = ("gs",)

# The files at the top of a run's folder a mirror copies, by name, each with
# the most of it a reader of the package reads (bytes): register_run_files.
_RUN_FILES: dict[str, int] = {}
_CHUNK = 1 << 20
# Seconds TensorStore's first read at a mirror's start may take (its
# credentials and the server; Google's own answers in well under one).
PROBE_S = 60.0


def register_run_files(bounds: Mapping[str, int]) -> None:
  """Names the files at the top of a run's folder that a mirror copies, each
  with its bound (training/sidefiles.py, which owns the side files' rules,
  calls this as it is imported); nothing else there is ever read."""
  _RUN_FILES.update(bounds)


def is_remote(path: Any) -> bool:
  """Whether `path` is a URL of a store the package works in (gs://)."""
  return isinstance(path, str) and any(path.startswith(f"{s}://") for s in SCHEMES)


def check_url(url: str, what: str) -> None:
  """ConfigError unless `url` (gs://BUCKET/PATH: `what` it is) names one
  place one way: a bucket, and a path without `.`, `..` or empty segments.
  Cloud Storage takes an object's name as written, while TensorStore
  resolves `..` (as a disk does): a run at gs://b/x/../y would keep its side
  files under x/../y/ and its checkpoints under y/, and no reader would find
  one beside the other. A slash at the end is allowed (it names the same
  folder)."""
  bucket, _, path = url.split("://", 1)[1].partition("/")
  segments = path.rstrip("/").split("/") if path.rstrip("/") else []
  odd = next((s for s in segments if s in ("", ".", "..")), None)
  if not bucket or odd is not None:
    which = (
      "no bucket"
      if not bucket
      else ("an empty segment (//)" if odd == "" else f"a {odd!r} segment")
    )
    raise ConfigError(
      f"{url}: {what} URL with {which}; give gs://BUCKET/PATH with each "
      "folder named once (Cloud Storage keeps names as written, TensorStore "
      "resolves them: the run's files would land in two places)"
    )


def _epath(url: str) -> epath.Path:
  from etils import epath  # imported only where a URL is used

  return epath.Path(url)


_LOG = logging.getLogger("compressive")


def _name_by_url(error: Optional[BaseException], local: str, url: str) -> None:
  """An error raised in the local folder `local` that stands for `url`,
  naming the URL where it named the folder (its message, and an OSError's
  file names, which the command line's one line shows): what a user reads
  names what they gave (the boundary of a mirror and of an upload)."""
  if not isinstance(error, Exception) or not local:
    return
  if isinstance(error, OSError):
    for name in ("filename", "filename2"):
      value = getattr(error, name, None)
      if isinstance(value, str) and local in value:
        setattr(error, name, value.replace(local, url))
  if len(error.args) == 1 and isinstance(error.args[0], str) and local in error.args[0]:
    error.args = (error.args[0].replace(local, url),)


@contextlib.contextmanager
def _reaching(what: str) -> Iterator[None]:
  """Any error of the storage client (no network, no credentials, a
  refusal) as one line: StorageError, `what` and why."""
  try:
    yield
  except UserError:
    raise
  except Exception as e:  # the clients' own exceptions (aiohttp, google.auth, gcsfs, tf)
    cause = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    raise StorageError(f"{what}: {type(e).__name__}" + (f": {cause}" if cause else "")) from e


# -- Paths that may be URLs (the checkpoints, an export's parameters). -------------


def isdir(path: str) -> bool:
  return _epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def exists(path: str) -> bool:
  return _epath(path).exists() if is_remote(path) else os.path.lexists(path)


def listdir(path: str) -> list[str]:
  if is_remote(path):
    return [p.name for p in _epath(path).iterdir()]
  return os.listdir(path)


def size(url: str) -> int:
  """The size of the object at `url` (FileNotFoundError when there is none)."""
  return _epath(url).stat().length


def read_bytes(url: str, limit: Optional[int] = None) -> bytes:
  """The object at `url`: at most `limit` + 1 bytes of it (a reader that
  checked its size first never reads more than it allows if it grew)."""
  with _epath(url).open("rb") as f:
    return f.read() if limit is None else f.read(limit + 1)


@contextlib.contextmanager
def _local_disk(what: str) -> Iterator[None]:
  """A local write of a mirror's copy that fails (a full disk) as one
  StorageError naming the copy and the local folder it goes to."""
  try:
    yield
  except OSError as e:
    if e.errno is None or isinstance(e, FileNotFoundError):
      raise
    raise StorageError(
      f"cannot copy {what} to this machine's temporary folder "
      f"{storage.temporary_folder()}: {e.strerror or e} (free space there, or "
      "set TMPDIR to another folder)"
    ) from e


def _copy(read: IO[bytes], write: IO[bytes], limit: Optional[int] = None) -> int:
  """Copies the stream `read` into `write` in chunks, at most `limit` + 1
  bytes (all without a limit); the bytes copied."""
  copied = 0
  while limit is None or copied <= limit:
    chunk = read.read(_CHUNK if limit is None else min(_CHUNK, limit + 1 - copied))
    if not chunk:
      break
    write.write(chunk)
    copied += len(chunk)
  return copied


def _objects(folder: epath.Path) -> list[epath.Path]:
  """Every file under the epath `folder`, listed folder by folder (epath
  refuses a recursive glob on Cloud Storage)."""
  found = []
  for item in folder.iterdir():
    found += _objects(item) if item.is_dir() else [item]
  return found


def move(path: str, target: str) -> None:
  """Moves the folder `path` to `target` in the same bucket (a copy of each
  object, streamed, then its removal: Cloud Storage renames nothing)."""
  source = _epath(path)
  for item in _objects(source):
    item.copy(_epath(f"{target}/{item.relative_to(source)}"), overwrite=True)
  source.rmtree()


def _upload(local: str, url: str, relative: str) -> None:
  with (
    open(os.path.join(local, relative), "rb") as f,
    _epath(f"{url}/{relative.replace(os.sep, '/')}").open("wb") as out,
  ):
    _copy(f, out)


def _identity(st: os.stat_result) -> tuple[int, int, int]:
  """A file, as a rename keeps it: its inode, size and modification time."""
  return st.st_ino, st.st_size, st.st_mtime_ns


def _files_under(folder: str) -> dict[str, tuple[int, int]]:
  """Each file under `folder` (relative path) -> (size, modification time)."""
  found = {}
  for parent, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(parent, name)
      st = os.lstat(path)
      found[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
  return found


# -- The mirror and the upload. -----------------------------------------------------


class Mirror:
  """A local folder (`local`) standing for the run at `url` while a tool
  works in it; see the module's docstring. `with Mirror(url) as mirror:`
  (layout.opened gives it as the run's Workdir). A user's error that ends
  the body names the URL where it named the local folder. `deadline`:
  seconds each pull, push and checkpoint save in it may go unanswered (None:
  no deadline)."""

  def __init__(self, url: str, deadline: Optional[float] = storage.DEFAULT_DEADLINE_S):
    check_url(url, "a run")
    self.url, self.deadline = url.rstrip("/"), deadline
    self.local = ""
    self._folder: Optional[storage.LocalFolder] = None
    self._copied: dict[str, tuple[int, int]] = {}
    # (inode, size, modification time) of a part-copy -> the object's name
    self._partial: dict[tuple[int, int, int], str] = {}
    self._held = self._pushed = False  # the URL held files; some were copied there

  def __enter__(self) -> Mirror:
    self._folder = storage.LocalFolder("compressive-mirror-", "run")
    self.local = self._folder.path
    try:
      with _reaching(f"cannot read {self.url}"):
        reach.bounded(self._pull, self.url, self.deadline)
      reach.tensorstore_reaches(self.url, min(self.deadline or PROBE_S, PROBE_S))
    except BaseException:
      self._close()
      raise
    return self

  def _pull(self) -> None:
    try:
      items = list(_epath(self.url).iterdir())  # a listing raises what a test of existence hides
    except Exception as e:
      if isinstance(e, FileNotFoundError) or type(e).__name__ == "NotFoundError":  # tf.io.gfile's
        self._check_bucket()
        return  # a new run: nothing there yet
      raise
    for item in items:
      bound = _RUN_FILES.get(item.name)
      if bound is None or not item.is_file():  # its folders (checkpoints, ...) stay there
        continue
      path = os.path.join(self.local, item.name)
      with item.open("rb") as f, _local_disk(f"{self.url}/{item.name}"), open(path, "wb") as out:
        if _copy(f, out, bound) > bound:  # found over its bound here, as on a disk
          out.flush()
          self._partial[_identity(os.fstat(out.fileno()))] = item.name
    self._copied = _files_under(self.local)
    self._held = bool(self._copied)

  def _check_bucket(self) -> None:
    """StorageError when the URL's bucket does not exist: no run is begun
    where a client would create the bucket, with the defaults of whatever
    project the credentials name."""
    scheme, rest = self.url.split("://", 1)
    bucket = rest.split("/", 1)[0]
    if not _epath(f"{scheme}://{bucket}").exists():
      raise StorageError(
        f"{self.url}: the bucket {bucket} does not exist, or these credentials "
        f"cannot see it; create it first (gcloud storage buckets create "
        f"{scheme}://{bucket})"
      )

  def push(self) -> None:
    """Copies each file made or changed here since the last copy to the
    URL, whole, within the deadline. A part-copy of an object over its
    bound is never copied: set aside here, the bucket's whole object is
    copied to that name in the bucket."""
    self._pushed = True
    storage.within(self.deadline, f"copying the run's files to {self.url}", self._push)

  def push_reporting(self) -> None:
    """push, any error of the storage client one line (StorageError)."""
    with _reaching(f"cannot copy the run's files to {self.url}"):
      self.push()

  def _push(self) -> None:
    changed = {
      r: seen for r, seen in sorted(_files_under(self.local).items()) if self._copied.get(r) != seen
    }
    for relative in list(changed):
      name = self._partial.get(_identity(os.lstat(os.path.join(self.local, relative))))
      if name is not None:  # a part-copy, set aside: the whole object, before it is replaced
        _epath(f"{self.url}/{name}").copy(_epath(f"{self.url}/{relative}"), overwrite=True)
        self._copied[relative] = changed.pop(relative)
    for relative, seen in changed.items():
      _upload(self.local, self.url, relative)
      self._copied[relative] = seen

  def __exit__(
    self, kind: Optional[type[BaseException]], error: Optional[BaseException], traceback: Any
  ) -> None:
    _name_by_url(error, self.local, self.url)
    try:
      # A new run that failed before its first checkpoint leaves nothing.
      if kind is None or self._held or self._pushed:
        self.push_reporting()
    except UserError as e:
      if kind is None:
        raise
      _LOG.warning("%s", e)  # the error that ended the tool is the one reported
    finally:
      self._close()

  def _close(self) -> None:
    if self._folder is not None:
      self._folder.close()


class Upload:
  """A new local folder for an output that goes to `url` (an export's
  --output), which must hold nothing; copied there, file by file, when the
  tool ends without an error. `with Upload(url, label) as upload:` (its
  `local` folder the export is written to); a user's error that ends the
  body names the URL where it named the local folder."""

  def __init__(self, url: str, label: str, deadline: Optional[float] = storage.DEFAULT_DEADLINE_S):
    check_url(url, "an output")
    self.url, self.label, self.deadline = url.rstrip("/"), label, deadline
    self.local = ""
    self._folder: Optional[storage.LocalFolder] = None

  def __enter__(self) -> Upload:
    target = _epath(self.url)
    with _reaching(f"cannot read {self.url}"):
      taken = reach.bounded(
        lambda: target.exists() and (target.is_file() or any(target.iterdir())),
        self.url,
        self.deadline,
      )
    reach.tensorstore_reaches(self.url, min(self.deadline or PROBE_S, PROBE_S))
    if taken:
      raise ConfigError(f"{self.label} exists and is not empty: give a new or empty place")
    self._folder = storage.LocalFolder("compressive-upload-", "output")
    self.local = self._folder.path
    os.rmdir(self.local)  # the export makes it, whole, when it is done
    return self

  def _upload_all(self) -> None:
    for relative in sorted(_files_under(self.local), key=lambda r: (os.sep not in r, r)):
      _upload(self.local, self.url, relative)

  def __exit__(
    self, kind: Optional[type[BaseException]], error: Optional[BaseException], traceback: Any
  ) -> None:
    _name_by_url(error, self.local, self.url)
    try:
      if kind is None and os.path.isdir(self.local):
        with _reaching(f"cannot write {self.url}"):
          # The top-level files (an export's manifest) last: a reader finds
          # an export only once it is whole.
          storage.within(self.deadline, f"writing {self.url}", self._upload_all)
    finally:
      if self._folder is not None:
        self._folder.close()
