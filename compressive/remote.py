"""Workdirs and exports on Cloud Storage (`gs://bucket/run`): a local mirror
of a run's small files, beside checkpoints and parameters that Orbax reads
and writes in the bucket itself.

A tool given a `gs://` workdir (cli.run does this for every tool's
--workdir and --output; `compressive.load` and `train_and_evaluate` for
their callers) works in a `Mirror`: a new local folder into which the files
at the top of the run's folder are copied first (config.json, train.log,
the metrics, the results, an export's manifest; never a folder), and in
which layout.py finds the checkpoints and an export's parameters in the
bucket (`beside`). The package's own file handling (the side files' checks,
the appends, the truncation on resume, the atomic writes) runs on local
files as for any workdir, and Orbax writes each checkpoint straight to
Cloud Storage through its own support (TensorStore), as on a TPU pod.

What the tool changed or added in the mirror is copied back (`push`), each
file whole: after every checkpoint a trainer saves (so the bucket's metrics
reach at least the newest checkpoint's step), and when the tool ends, by an
error too. A new run that fails before its first checkpoint leaves nothing
in the bucket. An export written to a URL (`Upload`) is made locally and
copied there when complete, its top-level files (the manifest) last.

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
import re
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator, Optional

from compressive.errors import ConfigError, UserError

# What the package reads and writes runs in; other URLs are refused
# (files.check_local).
SCHEMES = ("gs",)

# Each mirror open in this process, by its local folder (absolute).
_OPEN: dict[str, "Mirror"] = {}
# Each local folder standing for a URL (a mirror, an upload's output) -> the URL.
_NAMES: dict[str, str] = {}


class StorageError(UserError):
  """Cloud Storage could not be reached, or refused a read or a write."""


def is_remote(path: Any) -> bool:
  """Whether `path` is a URL of a store the package works in (gs://)."""
  return isinstance(path, str) and any(path.startswith(f"{s}://") for s in SCHEMES)


def _epath(url: str):
  from etils import epath  # pylint: disable=g-import-not-at-top  (only where a URL is used)
  return epath.Path(url)


def url_of(local: str) -> Optional[str]:
  """The URL whose mirror is the local folder `local`, or None."""
  mirror = None if is_remote(local) else _OPEN.get(os.path.abspath(local))
  return mirror.url if mirror is not None else None


def beside(root: str, name: str) -> str:
  """The path of `name` in the run at `root`: in the URL when `root` is the
  mirror of one (layout.py asks this of the checkpoints and of an export's
  parameters, which stay in the bucket), else in `root`."""
  url = url_of(root)
  return f"{url}/{name}" if url is not None else os.path.join(root, name)


def public(text: str) -> str:
  """`text` with each local folder that stands for a URL named by the URL:
  what a user reads names what they gave."""
  for local, url in _NAMES.items():
    text = text.replace(local, url)
  return text


class _Public(logging.Filter):
  """The package's log lines (the console's and train.log's) name each
  mirror by its URL, as `public` does."""

  def filter(self, record: logging.LogRecord) -> bool:
    record.msg, record.args = public(record.getMessage()), None
    return True


_LOG = logging.getLogger("compressive")
_PUBLIC = _Public()


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


# -- Reaching the store at the start: both clients, a bounded wait. ---------------

# The longest a tool waits for Cloud Storage's first answer at its start (no
# network: gcsfs retries for about a minute), saying every PROGRESS_SECONDS
# that it still waits.
START_SECONDS = 90.0
PROGRESS_SECONDS = 10.0


def _bounded(work: Callable[[], Any], url: str, seconds: Optional[float] = None,
             say: Optional[Callable[[str], None]] = None) -> Any:
  """work()'s result, run in a thread while this one waits at most
  `seconds`, saying every PROGRESS_SECONDS that it waits (`say`, default a
  warning line); StorageError when no answer came (the thread is left to
  its client)."""
  seconds = START_SECONDS if seconds is None else seconds
  say = say or (lambda text: _LOG.warning("%s", text))
  result: dict[str, Any] = {}

  def run() -> None:
    try:
      result["value"] = work()
    except BaseException as e:  # handed to the caller
      result["error"] = e

  thread = threading.Thread(target=run, name="compressive-storage-start", daemon=True)
  thread.start()
  start = time.monotonic()
  while thread.is_alive():
    waited = time.monotonic() - start
    if waited >= seconds:
      raise StorageError(f"no answer within {seconds:g} s (no network, or a server that "
                         "does not answer)")
    thread.join(min(PROGRESS_SECONDS, seconds - waited))
    if thread.is_alive() and time.monotonic() - start < seconds:
      say(f"still waiting for Cloud Storage ({url}): {time.monotonic() - start:.0f} s of at "
          f"most {seconds:g}")
  if "error" in result:
    raise result["error"]
  return result.get("value")


def _tensorstore_reaches(url: str, seconds: Optional[float] = None) -> None:
  """StorageError, in the file layer's words (`cannot read URL: ...`), when
  TensorStore, which reads and writes the checkpoints (through Orbax),
  cannot read the URL's bucket: it has its own endpoint
  (TENSORSTORE_GCS_HTTP_URL) and credentials, and would otherwise hang at
  the first save. Its log lines (the credentials it chose, once per
  process) are kept off the console; a failure's reason is its own."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top  (Orbax's; only for a URL)
  seconds = START_SECONDS if seconds is None else seconds
  bucket, _, path = url.split("://", 1)[1].partition("/")
  key = f"{path.rstrip('/')}/.compressive-probe".lstrip("/")

  def probe() -> None:
    store = ts.KvStore.open({"driver": "gcs", "bucket": bucket}).result(timeout=seconds)
    store.read(key).result(timeout=seconds)

  with _captured_stderr() as (said, say):
    try:
      _bounded(probe, url, seconds, say)
      return
    except StorageError as e:  # no answer
      why = str(e)
    except TimeoutError:  # TensorStore's own deadline, at the same time
      why = f"no answer within {seconds:g} s"
    except Exception as e:  # TensorStore's own (a refusal, no credentials)
      why = " ".join(str(e).split())[:300] or type(e).__name__
  told = [" ".join(line.split("] ", 1)[-1].split()) for line in said
          if _ABSL_LINE.match(line) and line[0] in "EW"]
  hint = ""
  if os.environ.get("STORAGE_EMULATOR_HOST") and not os.environ.get("TENSORSTORE_GCS_HTTP_URL"):
    hint = ("; with STORAGE_EMULATOR_HOST set, set TENSORSTORE_GCS_HTTP_URL to the same URL "
            "(and GOOGLE_AUTH_TOKEN_FOR_TESTING for an emulator)")
  raise StorageError(f"cannot read {url}: TensorStore, which writes the checkpoints: {why}"
                     + (f" ({told[-1][:300]})" if told else "") + hint)


@contextlib.contextmanager
def _captured_stderr() -> Iterator[tuple[list[str], Callable[[str], None]]]:
  """(lines, say): collects what is written to file descriptor 2 meanwhile
  (TensorStore logs there from C++: the credentials it uses, once per
  process) as `lines`, and `say` writes a warning line past it, to the
  console; after, the lines but TensorStore's own (absl's `I1205
  09:11:35.49 ... file.cc:136] ...`) are written to it."""
  lines: list[str] = []
  sys.stderr.flush()
  saved = os.dup(2)

  def say(text: str) -> None:
    os.write(saved, f"{time.strftime('%H:%M:%S')} warning: {public(text)}\n".encode())

  try:
    with tempfile.TemporaryFile() as held:
      os.dup2(held.fileno(), 2)
      try:
        yield lines, say
      finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        held.seek(0)
        lines += held.read().decode("utf-8", errors="replace").splitlines()
  finally:
    os.close(saved)
  kept = [line for line in lines if not _ABSL_LINE.match(line)]
  if kept:
    print("\n".join(kept), file=sys.stderr)


_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.]+:\d+\] ")


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


def read_bytes(url: str) -> bytes:
  return _epath(url).read_bytes()


def _objects(folder) -> list:
  """Every file under the epath `folder`, listed folder by folder (epath
  refuses a recursive glob on Cloud Storage)."""
  found = []
  for item in folder.iterdir():
    found += _objects(item) if item.is_dir() else [item]
  return found


def move(path: str, target: str) -> None:
  """Moves the folder `path` to `target` in the same bucket (a copy of each
  object, then its removal: Cloud Storage renames nothing)."""
  source = _epath(path)
  for item in _objects(source):
    _epath(f"{target}/{item.relative_to(source)}").write_bytes(item.read_bytes())
  source.rmtree()


def _upload(local: str, url: str, relative: str) -> None:
  with open(os.path.join(local, relative), "rb") as f:
    data = f.read()
  _epath(f"{url}/{relative.replace(os.sep, '/')}").write_bytes(data)


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
  """A local folder standing for the run at `url` while a tool works in it;
  see the module's docstring. `with Mirror(url) as local:`."""

  def __init__(self, url: str):
    self.url = url.rstrip("/")
    self.local = ""
    self._copied: dict[str, tuple[int, int]] = {}
    self._held = self._pushed = False  # the URL held files; some were copied there

  def __enter__(self) -> str:
    self.local = os.path.realpath(tempfile.mkdtemp(prefix="compressive-mirror-"))
    _OPEN[self.local] = self
    _NAMES[self.local] = self.url
    _LOG.addFilter(_PUBLIC)
    try:
      with _reaching(f"cannot read {self.url}"):
        _bounded(self._pull, self.url)
        _tensorstore_reaches(self.url)
    except BaseException:
      self._close()
      raise
    return self.local

  def _pull(self) -> None:
    try:
      items = list(_epath(self.url).iterdir())  # a listing raises what a test of existence hides
    except Exception as e:  # pylint: disable=broad-except
      if isinstance(e, FileNotFoundError) or type(e).__name__ == "NotFoundError":  # tf.io.gfile's
        self._check_bucket()
        return  # a new run: nothing there yet
      raise
    for item in items:
      if item.is_file():  # its folders (checkpoints, params, TensorBoard's) stay there
        with open(os.path.join(self.local, item.name), "wb") as f:
          f.write(item.read_bytes())
    self._copied = _files_under(self.local)
    self._held = bool(self._copied)

  def _check_bucket(self) -> None:
    """StorageError when the URL's bucket does not exist: no run is begun
    where a client would create the bucket, with the defaults of whatever
    project the credentials name."""
    scheme, rest = self.url.split("://", 1)
    bucket = rest.split("/", 1)[0]
    if not _epath(f"{scheme}://{bucket}").exists():
      raise StorageError(f"{self.url}: the bucket {bucket} does not exist, or these credentials "
                         f"cannot see it; create it first (gcloud storage buckets create "
                         f"{scheme}://{bucket})")

  def push(self) -> None:
    """Copies each file made or changed here since the last copy to the
    URL, whole."""
    self._pushed = True
    for relative, seen in sorted(_files_under(self.local).items()):
      if self._copied.get(relative) != seen:
        _upload(self.local, self.url, relative)
        self._copied[relative] = seen

  def __exit__(self, kind, error, traceback) -> None:
    try:
      # A new run that failed before its first checkpoint leaves nothing.
      if kind is None or self._held or self._pushed:
        with _reaching(f"cannot copy the run's files to {self.url}"):
          self.push()
    except UserError as e:
      if kind is None:
        raise
      _LOG.warning("%s", e)  # the error that ended the tool is the one reported
    finally:
      self._close()

  def _close(self) -> None:
    _OPEN.pop(self.local, None)
    _NAMES.pop(self.local, None)
    if not _OPEN:
      _LOG.removeFilter(_PUBLIC)
    shutil.rmtree(self.local, ignore_errors=True)


def push(local: str) -> None:
  """Mirror.push of the mirror whose folder is `local`; nothing when
  `local` is no mirror (a workdir on this machine)."""
  mirror = _OPEN.get(os.path.abspath(local))
  if mirror is not None:
    with _reaching(f"cannot copy the run's files to {mirror.url}"):
      mirror.push()


class Upload:
  """A new local folder for an output that goes to `url` (an export's
  --output), which must hold nothing; copied there, file by file, when the
  tool ends without an error. `with Upload(url, label) as local:`."""

  def __init__(self, url: str, label: str):
    self.url, self.label = url.rstrip("/"), label
    self.parent = self.local = ""

  def __enter__(self) -> str:
    target = _epath(self.url)
    with _reaching(f"cannot read {self.url}"):
      taken = _bounded(lambda: target.exists() and (target.is_file() or any(target.iterdir())),
                       self.url)
      _tensorstore_reaches(self.url)
    if taken:
      raise ConfigError(f"{self.label} exists and is not empty: give a new or empty place")
    self.parent = os.path.realpath(tempfile.mkdtemp(prefix="compressive-upload-"))
    self.local = os.path.join(self.parent, "output")
    _NAMES[self.local] = self.url
    return self.local

  def __exit__(self, kind, error, traceback) -> None:
    try:
      if kind is None and os.path.isdir(self.local):
        with _reaching(f"cannot write {self.url}"):
          # The top-level files (an export's manifest) last: a reader finds
          # an export only once it is whole.
          for relative in sorted(_files_under(self.local), key=lambda r: (os.sep not in r, r)):
            _upload(self.local, self.url, relative)
    finally:
      _NAMES.pop(self.local, None)
      shutil.rmtree(self.parent, ignore_errors=True)
