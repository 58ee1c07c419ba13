"""A run's metrics: each stream's JSON-lines file, handed on to the metric
writers (writers.py: TensorBoard event files by default, W&B, a user's own);
reading and truncating the files.

TensorBoard's event files are written with tensorboardX (protobuf and numpy
only), not TensorFlow: training never imports TensorFlow.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from compressive import files
from compressive.errors import naming as _naming
from compressive.training import layout, savedjson, sidefiles, writers

_log = logging.getLogger("compressive")


class MetricWriter:
  """One stream's metrics (`name`: "train" or "eval"): each record appended
  to `<workdir>/metrics_<name>.jsonl` (layout.Workdir's metrics: the run's
  own record, which its curve, its resume and the tools read), and handed
  to the metric writers `sinks` (writers.py: TensorBoard, W&B, a user's),
  which the run opens once for both streams and closes itself; without
  `sinks`, a TensorBoard writer of its own, closed with it. `enabled=False`
  on non-writing processes: nothing is written or opened."""

  def __init__(
    self,
    workdir: layout.Where,
    name: str = "train",
    enabled: bool = True,
    sinks: Optional[Sequence[Any]] = None,
  ):
    self.enabled, self.name = enabled, name
    self.jsonl = layout.workdir(workdir).metrics(name)
    self._owned = sinks is None and enabled
    self.sinks = (
      list(sinks or ()) if not self._owned else [writers.TensorBoard(writers.run_of(workdir, {}))]
    )

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    record = {"step": int(step), **{k: v if math.isfinite(v) else None for k, v in scalars.items()}}
    append_line(self.jsonl, json.dumps(record, allow_nan=False))  # NaN is null: valid JSON
    for sink in self.sinks:
      sink.write(self.name, int(step), scalars)

  def write_hparams(self, config: Any) -> None:
    """Hands the run's config (nested, as Experiment.to_dict gives it) to
    the writers (TensorBoard's HPARAMS tab, W&B's config). Call once per
    run start, on the train stream's writer."""
    if not self.enabled:
      return
    for sink in self.sinks:
      sink.write_hparams(config)

  def close(self) -> None:
    if self._owned:
      for sink in self.sinks:
        sink.close()
      self.sinks = []


def append_line(path: str, line: str) -> None:
  """Appends `line` and a newline whole, or not at all: a write the disk
  refuses part way is cut back off, so the file stays whole lines."""
  data = (line + "\n").encode("utf-8")
  with _naming(path):
    fd = files.open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
      size = os.fstat(fd).st_size
      try:
        written = os.write(fd, data)
        if written != len(data):
          raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      except OSError:
        try:
          os.ftruncate(fd, size)
        except OSError:
          pass
        raise
    finally:
      os.close(fd)


def _record(path: str, line: str) -> Optional[dict[str, Any]]:
  """The record a metrics line holds, or None (a line a write cut short, or
  any other that is not one: savedjson.parse). A number beyond a float, and
  NaN or Infinity (which files of older versions held), read as null."""
  try:
    record = savedjson.parse(line, path, nonfinite_as_null=True)
  except savedjson.DamagedJSONError:
    return None
  step = record.get("step")
  return record if isinstance(step, int) and not isinstance(step, bool) else None


def _warn_torn(path: str, torn: list[int], public: Callable[[str], str]) -> None:
  if torn:
    _log.warning(
      "%s: line(s) %s are not whole records (a write cut short, or damaged); left out",
      public(path),
      ", ".join(map(str, torn[:5])) + (", ..." if len(torn) > 5 else ""),
    )


def read_jsonl(path: str, public: Callable[[str], str] = str) -> list[dict]:
  """The records of a JSON-lines metrics file. A line that is not a whole
  record (a write cut short by a crash or a full disk, before append_line
  guarded against it, or any line savedjson.parse calls damaged) is left
  out with a warning: a side file never stops
  a run or a tool. Only a regular file is read (files.NotAFileError
  for anything else in its place, or one beyond sidefiles.METRICS_BYTES).
  `public` names the path in a warning (layout.Workdir.public: a mirror's
  file by its URL)."""
  if not os.path.lexists(path):
    return []
  records, torn = [], []
  with sidefiles.lines(path, sidefiles.METRICS_BYTES) as f:
    for number, line in enumerate(f, start=1):
      if line.strip():
        record = _record(path, line)
        if record is None:
          torn.append(number)
        else:
          records.append(record)
  _warn_torn(path, torn, public)
  return records


def _replace_lines(path: str, lines: Iterable[str]) -> None:
  """Replaces the file's lines at once (a temporary file renamed over it),
  so that a crash leaves the old file or the new one, never half of each."""
  with files.replacing(path) as f:
    f.writelines(lines)


def truncate_jsonl(path: str, step: int, public: Callable[[str], str] = str) -> None:
  """Drops the records after `step` (and any line a crash cut short),
  replacing the file at once; streamed, so a long run's file is never held
  in memory. A metrics file too large to read (sidefiles.METRICS_BYTES) is
  set aside with a warning, and the run starts a new one. `public` names
  the path in a warning, as read_jsonl's."""
  if files.kind(path) is None:
    return
  try:
    with sidefiles.lines(path, sidefiles.METRICS_BYTES) as f:
      torn = []

      def kept() -> Iterator[str]:
        for number, line in enumerate(f, start=1):
          if line.strip():
            record = _record(path, line)
            if record is None:
              torn.append(number)
            elif record["step"] <= step:
              yield json.dumps(record) + "\n"

      _replace_lines(path, kept())
  except files.NotAFileError as e:
    if e.path != path:
      raise
    sidefiles.set_aside(path, e.what, public)
    return
  _warn_torn(path, torn, public)
