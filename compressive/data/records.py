"""Documents kept as records: JSON lines or Parquet files, a text field per
record, one document each (`data.source=records`).

Layout of `data.records.path`, either:
- one file (`corpus.jsonl` or `corpus.parquet`): its records split by a
  hash of their names (`corpus.jsonl:17`, documents.split_by_hash with
  heldout_fraction), as text_files splits its files;
- a folder of such files whose names start with a split's name
  (`train.jsonl`, `validation.jsonl`, `test-00000-of-00001.parquet`, the
  layout `datasets` writes): each split its files' records, in name order;
- a folder of such files without split names: every file's records, split
  by hash as one file's are.

A JSON-lines file holds one JSON object per line (blank lines skipped);
`data.records.text_field` (default `text`) names the field that holds the
document, a string; other fields are ignored. A Parquet file (the `parquet`
extra: pyarrow) holds it as a string column. Records are read lazily, by
index (a JSON line by its byte offset, found by one pass over the file;
Parquet by row group), and exactly as stored. `check_documents` reads every
record of a split once: a line that is no JSON object, a record without
the field or whose value is not a string, and a text too short to predict
(fewer than 2 tokens) are one line naming the file and the record. A
resume compares the files (names and sizes) with those it was saved on.

Config (`config.data.records`): path, text_field ('text'), heldout_fraction
(0.05).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import json
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

from compressive import values
from compressive.data import documents as documents_lib
from compressive.data import registry, tokenizers
from compressive.errors import ConfigError, DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig

SUFFIXES = (".jsonl", ".parquet")


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.records`: the files, the field that holds each document's text,
  and the held-out share."""

  path: str = ""  # A .jsonl or .parquet file, or a folder of them.
  text_field: str = "text"  # The field (JSON) or column (Parquet) holding the text.
  # Held-out share of records for each of validation and test when the
  # split is made by hash.
  heldout_fraction: float = 0.05


def validate(data_config: "DataConfig") -> None:
  c = data_config.section(Config)
  if not (
    os.path.isdir(c.path or "") or (os.path.isfile(c.path or "") and c.path.endswith(SUFFIXES))
  ):
    raise ConfigError(
      f"data.records.path={c.path!r} is neither a .jsonl or .parquet file nor a folder of them"
    )
  if not isinstance(c.text_field, str) or not c.text_field:
    raise ConfigError(
      f"data.records.text_field={c.text_field!r} must name the field that holds the text"
    )
  values.number("data.records.heldout_fraction", c.heldout_fraction, "(0, 0.5)")


# -- One file: its records by index. ---------------------------------------------


class _Jsonl:
  """A JSON-lines file's records, each found by its byte offset."""

  def __init__(self, path: str):
    self.path = path
    self.offsets = _line_offsets(path, *_stamp(path))

  def __len__(self) -> int:
    return len(self.offsets)

  def text(self, i: int, field: str) -> str:
    try:
      with open(self.path, "rb") as f:
        f.seek(self.offsets[i])
        line = f.readline()
    except OSError as e:
      raise DataError(f"{self.path}: cannot read ({e.strerror or e})") from e
    try:
      record = json.loads(line)
    except ValueError as e:
      raise DataError(f"{self.path}:{i + 1} (record {i}) is not JSON ({e})") from None
    return _field(record, field, f"{self.path}:{i + 1} (record {i})")


@functools.lru_cache(maxsize=16)
def _line_offsets(path: str, size: int, mtime_ns: int) -> tuple[int, ...]:
  """The byte offset of each non-blank line of the file (one pass over it,
  cached by the file's size and time)."""
  del size, mtime_ns  # the cache key only
  offsets, at = [], 0
  try:
    with open(path, "rb") as f:
      for line in f:
        if line.strip():
          offsets.append(at)
        at += len(line)
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror or e})") from e
  return tuple(offsets)


class _Parquet:
  """A Parquet file's text column, read a row group at a time."""

  def __init__(self, path: str, field: str):
    pq = _pyarrow_parquet()
    self.path = path
    try:
      self.file = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's ArrowInvalid and the like: not a Parquet file
      raise DataError(f"{path}: cannot read it as Parquet ({_one_line(e)})") from None
    names = self.file.schema_arrow.names
    if field not in names:
      raise DataError(
        f"{path}: no column {field!r} (data.records.text_field); its columns: "
        f"{', '.join(names[:20])}"
      )
    self.field = field
    rows = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
    self.starts = [sum(rows[:g]) for g in range(len(rows))]
    self.rows = sum(rows)
    self._group: tuple[int, list[Any]] = (-1, [])

  def __len__(self) -> int:
    return self.rows

  def text(self, i: int, field: str) -> str:
    group = bisect.bisect_right(self.starts, i) - 1
    if self._group[0] != group:
      column = self.file.read_row_group(group, columns=[self.field]).column(0)
      self._group = (group, column.to_pylist())
    return _field({field: self._group[1][i - self.starts[group]]}, field, f"{self.path} (row {i})")


def _pyarrow_parquet() -> ModuleType:
  try:
    import pyarrow.parquet as pq
  except ImportError:
    raise DataError(
      'reading Parquet needs pyarrow: pip install "compressive[parquet]" (or pip install pyarrow)'
    ) from None
  return pq


def _field(record: Any, field: str, where: str) -> str:
  if not isinstance(record, dict):
    raise DataError(
      f"{where} is a JSON {type(record).__name__}, not an object with a {field!r} field"
    )
  if field not in record:
    raise DataError(
      f"{where} has no {field!r} field (data.records.text_field); its fields: "
      f"{', '.join(list(record)[:20]) or 'none'}"
    )
  text = record[field]
  if not isinstance(text, str):
    raise DataError(f"{where}: its {field!r} is not a string ({type(text).__name__})")
  return text


def _stamp(path: str) -> tuple[int, int]:
  st = os.stat(path)
  return st.st_size, st.st_mtime_ns


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split())[:200] or type(e).__name__


def _open(path: str, field: str) -> _Jsonl | _Parquet:
  return _Parquet(path, field) if path.endswith(".parquet") else _Jsonl(path)


# -- The corpus: its files and splits. --------------------------------------------


def _files(path: str) -> list[str]:
  """The corpus's files: `path` itself, or the .jsonl/.parquet files of the
  folder, sorted by name."""
  if os.path.isfile(path):
    return [path]
  try:
    names = sorted(
      n for n in os.listdir(path) if n.endswith(SUFFIXES) and os.path.isfile(os.path.join(path, n))
    )
  except OSError as e:
    raise DataError(f"{path}: cannot list the folder ({e.strerror or e})") from e
  if not names:
    raise DataError(f"no .jsonl or .parquet files in {path} (data.records.path)")
  return [os.path.join(path, n) for n in names]


def _split_files(paths: list[str]) -> dict[str, list[str]] | None:
  """{split: its files} when the files' names start with split names, else
  None (the records are split by hash)."""
  named = {s: [p for p in paths if os.path.basename(p).startswith(s)] for s in registry.SPLITS}
  if not any(named.values()):
    return None
  missing = [s for s, ps in named.items() if not ps]
  if missing:
    raise DataError(
      f"{os.path.dirname(paths[0])} names its files by split but has none for "
      f"{', '.join(missing)}: give every split a file (train*, validation*, test*), or none "
      "of them, to split the records by hash"
    )
  return named


@functools.lru_cache(maxsize=8)
def _layout(
  path: str, field: str, heldout: float, stamps: tuple
) -> dict[str, list[tuple[int, int]]]:
  """{split: [(file index, record index)]} of the corpus at `path` (cached
  by its files' sizes and times, `stamps`)."""
  del stamps  # the cache key only
  paths = _files(path)
  by_split = _split_files(paths)
  if by_split is not None:
    return {
      s: [(paths.index(p), r) for p in ps for r in range(len(_open(p, field)))]
      for s, ps in by_split.items()
    }
  records = [(k, r) for k, p in enumerate(paths) for r in range(len(_open(p, field)))]
  keys = [f"{os.path.basename(paths[k])}:{r}" for k, r in records]
  chosen = documents_lib.split_by_hash(keys, heldout)
  return {s: [records[i] for i in chosen[s]] for s in registry.SPLITS}


def _split(c: Config, split: str) -> tuple[list[str], list[tuple[int, int]]]:
  """(the corpus's files, the split's (file, record) pairs)."""
  registry.check_split(split)
  if not c.path:
    raise DataError(
      "data.source=records needs data.records.path, a .jsonl or .parquet file or a folder of them"
    )
  paths = _files(c.path)
  stamps = tuple(_stamp(p) for p in paths)
  return paths, _layout(os.path.abspath(c.path), c.text_field, c.heldout_fraction, stamps)[split]


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.TextDocuments:
  c = data_config.section(Config)
  paths, chosen = _split(c, split)
  opened: dict[int, Any] = {}

  def text(i: int) -> str:
    k, r = chosen[i]
    if k not in opened:
      opened[k] = _open(paths[k], c.text_field)
    return opened[k].text(r, c.text_field)

  return documents_lib.TextDocuments(
    names=lambda i: f"{os.path.basename(paths[chosen[i][0]])}:{chosen[i][1]}",
    load_text=text,
    tokenizer=tokenizer,
    description=f"records/{split}",
    cache_tokens=data_config.cache_tokens,
    num_documents=len(chosen),
  )


def check_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer | None = None
) -> int:
  """Reads every record of the split once: DataError naming the first that
  is not a JSON object with a string in data.records.text_field, or whose
  text has fewer than 2 tokens. Returns the number of records."""
  docs = get_documents(data_config, split, tokenizer or tokenizers.ByteTokenizer())
  for i in range(len(docs)):
    text = docs.text(i)
    if len(docs.tokenizer.encode(text[:65])) < 2:
      raise DataError(
        f"{docs.name(i)} ({docs.description}) has fewer than 2 tokens: a "
        "document needs 2 to give one prediction; remove or extend it"
      )
  return len(docs)


def identity(data_config: "DataConfig") -> str:
  """The corpus's files, by name and size, as a digest: what a resume compares."""
  c = data_config.section(Config)
  listing = [(os.path.basename(p), os.path.getsize(p)) for p in _files(c.path)]
  digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
  return f"records: {len(listing)} files, {sum(s for _, s in listing)} bytes, sha256 {digest[:16]}"


registry.register(
  registry.Source(
    name="records",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    check_documents=check_documents,
    identity=identity,
    location_fields=("path",),
  )
)
