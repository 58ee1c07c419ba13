"""Reaching Cloud Storage at a tool's start, with both of its clients: the
file layer's (gcsfs or tf.io.gfile, remote.Mirror's pulls) and TensorStore's
(Orbax's checkpoints, with its own endpoint and credentials), each wait
bounded (storage.within) and saying every storage.PROGRESS_S that it still
waits, each failure one line (StorageError)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Optional

from compressive import storage
from compressive.errors import StorageError

_LOG = logging.getLogger("compressive")


def bounded(
  work: Callable[[], Any],
  url: str,
  seconds: Optional[float],
  say: Optional[Callable[[str], None]] = None,
) -> Any:
  """work()'s result, waited for at most `seconds` (storage.within: None, no
  deadline), saying every storage.PROGRESS_S that it still waits (`say`,
  default a warning line); storage.StorageTimeout when no answer came."""
  say = say or (lambda text: _LOG.warning("%s", text))
  bound = "" if seconds is None else f" of at most {seconds:g}"
  return storage.within(
    seconds,
    f"reading {url}",
    work,
    progress=lambda waited: say(f"still waiting for Cloud Storage ({url}): {waited:.0f} s{bound}"),
  )


def tensorstore_reaches(url: str, seconds: Optional[float]) -> None:
  """StorageError, in the file layer's words (`cannot read URL: ...`), when
  TensorStore, which reads and writes the checkpoints (through Orbax),
  cannot read the URL's bucket: it has its own endpoint
  (TENSORSTORE_GCS_HTTP_URL) and credentials, and would otherwise hang at
  the first save. Its log lines (the credentials it chose, once per
  process) are kept off the console; a failure's reason is its own."""
  import tensorstore as ts  # Orbax's; only for a URL

  bucket, _, path = url.split("://", 1)[1].partition("/")
  key = f"{path.rstrip('/')}/.compressive-probe".lstrip("/")

  def probe() -> None:
    store = ts.KvStore.open({"driver": "gcs", "bucket": bucket}).result(timeout=seconds)
    store.read(key).result(timeout=seconds)

  with captured_stderr() as (said, say):
    try:
      bounded(probe, url, seconds, say)
      return
    except storage.StorageTimeout:  # no answer
      why = f"no answer within {seconds:g} s"
    except TimeoutError:  # TensorStore's own deadline, at the same time
      why = f"no answer within {seconds:g} s"
    except Exception as e:  # TensorStore's own (a refusal, no credentials)
      why = " ".join(str(e).split())[:300] or type(e).__name__
  told = [
    " ".join(line.split("] ", 1)[-1].split())
    for line in said
    if _ABSL_LINE.match(line) and line[0] in "EW"
  ]
  hint = ""
  if os.environ.get("STORAGE_EMULATOR_HOST") and not os.environ.get("TENSORSTORE_GCS_HTTP_URL"):
    hint = (
      "; with STORAGE_EMULATOR_HOST set, set TENSORSTORE_GCS_HTTP_URL to the same URL "
      "(and GOOGLE_AUTH_TOKEN_FOR_TESTING for an emulator)"
    )
  raise StorageError(
    f"cannot read {url}: TensorStore, which writes the checkpoints: {why}"
    + (f" ({told[-1][:300]})" if told else "")
    + hint
  )


@contextlib.contextmanager
def captured_stderr() -> Iterator[tuple[list[str], Callable[[str], None]]]:
  """(lines, say): collects what is written to file descriptor 2 meanwhile
  (TensorStore logs there from C++: the credentials it uses, once per
  process) as `lines`, and `say` writes a warning line past it, to the
  console; after, the lines but TensorStore's own (absl's `I1205
  09:11:35.49 ... file.cc:136] ...`) are written to it."""
  lines: list[str] = []
  sys.stderr.flush()
  saved = os.dup(2)

  def say(text: str) -> None:
    os.write(saved, f"{time.strftime('%H:%M:%S')} warning: {text}\n".encode())

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
