"""Generated documents, made once per config and kept on disk.

A source that generates its documents (the recall task: thousands of
documents of planted facts, minutes of work) asks `cached_documents` for
them: the first time it makes them, later it reads them back from
`<cache>/generated/<kind>-<digest>.npz`, where `<cache>` is
`$XDG_CACHE_HOME/compressive` (`~/.cache/compressive` when the variable is
unset, the XDG base-directory default). The digest names everything the
documents depend on: the source's kind, its key (the split and every field
of its section) and the bytes of the module that generates them, so a
changed generator never reads an old cache. A file that cannot be read
back is made again; one that cannot be written costs only the next start's
minutes. A tool reading a saved run (plugins.saved_config) reads the cache
but writes nothing (registry.may_write).

Each document is its text and a list of records (a small frozen dataclass
of ints and booleans, e.g. recall.Query): the file holds the texts'
UTF-8 bytes with their offsets, and the records as rows of integers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from compressive import files
from compressive.data import registry

_log = logging.getLogger("compressive")
R = TypeVar("R")
# Bumped when the file's layout changes: older files are then not read.
FORMAT = 1


def cache_folder() -> str:
  """<cache>/generated: $XDG_CACHE_HOME/compressive, or ~/.cache/compressive."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "compressive", "generated")


def _path(kind: str, key: dict[str, Any], module_file: str) -> str:
  with open(module_file, "rb") as f:
    code = hashlib.sha256(f.read()).hexdigest()
  identity = json.dumps(
    {"format": FORMAT, "kind": kind, "key": key, "code": code}, sort_keys=True, default=list
  )
  return os.path.join(
    cache_folder(), f"{kind}-{hashlib.sha256(identity.encode()).hexdigest()[:32]}.npz"
  )


def _pack(texts: Sequence[str], records: Sequence[Sequence[Any]]) -> bytes:
  encoded = [t.encode("utf-8") for t in texts]
  rows = [(i, *dataclasses.astuple(r)) for i, doc in enumerate(records) for r in doc]
  width = 1 + (len(rows[0]) - 1 if rows else 0)
  buffer = io.BytesIO()
  np.savez(
    buffer,
    text=np.frombuffer(b"".join(encoded), np.uint8),
    ends=np.cumsum([len(e) for e in encoded], dtype=np.int64),
    records=np.asarray(rows, np.int64).reshape(len(rows), width),
  )
  return buffer.getvalue()


def _unpack(data: bytes, record_type: Callable[..., R]) -> tuple[list[str], list[list[R]]]:
  with np.load(io.BytesIO(data)) as f:
    text, ends, rows = f["text"].tobytes(), f["ends"], f["records"]
  starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
  texts = [text[a:b].decode("utf-8") for a, b in zip(starts, ends)]
  fields = dataclasses.fields(record_type)  # type: ignore[arg-type]
  records: list[list[R]] = [[] for _ in texts]
  for row in rows.tolist():
    values = [bool(v) if f.type in (bool, "bool") else int(v) for f, v in zip(fields, row[1:])]
    records[row[0]].append(record_type(*values))
  return texts, records


def cached_documents(
  kind: str,
  key: dict[str, Any],
  module_file: str,
  record_type: Callable[..., R],
  make: Callable[[], tuple[list[str], list[list[R]]]],
) -> tuple[list[str], list[list[R]]]:
  """(texts, records per document): read from the cache, or `make()`'s,
  saved there for the next time (module docstring). `key` holds what the
  documents depend on besides `module_file`, the generating module."""
  path = _path(kind, key, module_file)
  try:
    with open(path, "rb") as f:
      return _unpack(f.read(), record_type)
  except FileNotFoundError:
    pass
  except Exception as e:  # a damaged or foreign file: made again, and replaced
    _log.info(
      "%s cannot be read back (%s: %s); the documents are made again", path, type(e).__name__, e
    )
  texts, records = make()
  if registry.may_write():
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      files.write_bytes(path, _pack(texts, records))
    except OSError as e:
      _log.info(
        "the generated documents are not cached: cannot write %s (%s)", path, e.strerror or e
      )
  return texts, records
