"""The user's own corpus: a folder of UTF-8 `*.txt` files, one document each,
or one text file cut into documents.

Layout, either:
- `<path>/train/*.txt`, `<path>/validation/*.txt`, `<path>/test/*.txt`:
  explicit splits (asking for a split whose folder is missing is an error);
- `<path>/*.txt`: split by document, by a hash of the file name
  (documents.split_by_hash with heldout_fraction; at least 3 files);
- `<path>` one file (`input.txt`): cut into consecutive documents of at most
  `document_bytes` bytes, each ending at a line's end where the piece holds
  one (else at a character's end), a last piece under a quarter of that
  joined to the one before; the pieces are split by a hash of their names
  (`input.txt:0007`) as files are. A file that gives fewer than
  ENOUGH_PIECES documents so is cut into that many, smaller ones (a line
  says so).

Files are read lazily, one at a time, and exactly as stored (no newline or
whitespace changes; only a leading byte-order mark is dropped). Invalid
UTF-8 is an error naming the file unless text_errors='replace'; so are
an unreadable or empty file and a file name that is not printable UTF-8.
`check_documents` finds all of these up front, reading every file once
(compressive/data/text_reading.py reads one file).

Config (`config.data.text_files`): path (the folder, or one file),
heldout_fraction (0.05), text_errors ('strict' | 'replace'),
document_bytes (16384: the pieces of one file).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from typing import TYPE_CHECKING

from compressive import files, values
from compressive.data import documents as documents_lib
from compressive.data import registry, tokenizers
from compressive.data.text_reading import (
  SHORT_CHARS,
  TEXT_ERRORS,
  check_file,
  check_name,
  read_text,
  shown,
)
from compressive.errors import ConfigError, DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig

_log = logging.getLogger("compressive")


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.text_files`: the text, its split and its decoding."""

  path: str = values.text("")  # The folder of *.txt files (or of train/, validation/, test/).
  # Held-out share of documents for each of validation and test when the
  # split is made by hash.
  heldout_fraction: float = values.real(0.05, "(0, 0.5)")
  # How undecodable UTF-8 is handled: 'strict' raises an error naming the
  # file; 'replace' substitutes U+FFFD (counted in num_bytes as the 3 bytes
  # of U+FFFD, since num_bytes measures the text the model sees).
  text_errors: str = values.text("strict", TEXT_ERRORS, "'strict' or 'replace'")
  # When path is one file: it is cut into documents of at most this many
  # bytes, at line ends (a 1 MB file gives about 64 documents).
  document_bytes: int = values.whole(16384, "[64, 2**31)", "an integer >= 64 (bytes)")

  def __post_init__(self) -> None:
    values.check_fields(self, "data.text_files.")


def validate(data_config: "DataConfig") -> None:
  c = data_config.section(Config)
  files.check_local(c.path, "data.text_files.path (a folder or a file)")
  if not (os.path.isdir(c.path or "") or os.path.isfile(c.path or "")):
    raise ConfigError(
      f"data.text_files.path={c.path!r} is neither a folder of .txt files nor a text file"
    )


def _txt_files(folder: str) -> list[str]:
  """Names of the *.txt files in folder, sorted; DataError for a name that
  cannot be shown or hashed."""
  try:
    listed = os.listdir(folder)
  except OSError as e:
    raise DataError(f"{shown(folder)}: cannot list the folder ({e.strerror or e})") from e
  dangling = sorted(
    n for n in listed if n.endswith(".txt") and not os.path.exists(os.path.join(folder, n))
  )
  if dangling:
    raise DataError(
      f"{shown(os.path.join(folder, dangling[0]))}: a link to a file that does "
      f"not exist ({len(dangling)} such .txt link(s) in {shown(folder)}); remove "
      "it or restore its target"
    )
  names = sorted(
    n for n in listed if n.endswith(".txt") and os.path.isfile(os.path.join(folder, n))
  )
  for n in names:
    check_name(os.path.join(folder, n))
  return names


def list_split(path: str, split: str, heldout_fraction: float) -> list[str]:
  """Paths of the files of one split, in sorted order."""
  registry.check_split(split)
  if not path:
    raise DataError("data.source=text_files needs data.text_files.path, a folder of *.txt files")
  if not os.path.isdir(path):
    raise FileNotFoundError(f"data.text_files.path {path!r} is not an existing folder")
  if any(os.path.isdir(os.path.join(path, s)) for s in registry.SPLITS):
    folder = os.path.join(path, split)
    if not os.path.isdir(folder):
      raise FileNotFoundError(
        f"{path} has split subfolders but no {split!r}: expected {folder}/*.txt"
      )
    names = _txt_files(folder)
    if not names:
      raise DataError(f"no *.txt files in {folder}")
    return [os.path.join(folder, n) for n in names]
  names = _txt_files(path)
  if not names:
    raise DataError(f"no *.txt files in {path} (and no train/validation/test subfolders)")
  if len(names) < 3:
    raise DataError(
      f"{path} holds {len(names)} *.txt file(s); splitting by document "
      "needs at least 3: put files in train/, validation/ and test/ "
      "subfolders, or give one file as data.text_files.path to cut it into documents"
    )
  chosen = documents_lib.split_by_hash(names, heldout_fraction)[split]
  return [os.path.join(path, names[i]) for i in chosen]


def _split_paths(data_config: "DataConfig", split: str) -> tuple[list[str], str]:
  """The split's file paths and text_errors, the latter checked now rather
  than at the first read."""
  c = data_config.section(Config)
  paths = list_split(c.path, split, c.heldout_fraction)
  if c.text_errors not in TEXT_ERRORS:
    raise DataError(
      f"data.text_files.text_errors must be 'strict' or 'replace', got {c.text_errors!r}"
    )
  return paths, c.text_errors


# -- One file cut into documents. ---------------------------------------------------


def character_cut(data: bytes) -> int:
  """Where a piece with no line end is cut, in bytes from its start: before
  the character at its end (a lead byte and at most 3 continuation bytes),
  so that no character is split between two documents; the whole piece when
  its end is no such character (bytes that are not UTF-8: the decoder names
  them, or replaces them) or the piece is that character alone, so that a
  cut always advances."""
  n = len(data)
  lead = n - 1
  while lead >= max(n - 4, 0) and data[lead] & 0xC0 == 0x80:
    lead -= 1
  if 0 < lead and n - lead <= 4 and data[lead] >= 0xC0:
    return lead
  return n


@functools.lru_cache(maxsize=8)
def _pieces(path: str, size: int, mtime_ns: int, piece_bytes: int) -> tuple[tuple[int, int], ...]:
  """(start, end) byte ranges of the file's documents (the module's
  docstring), found by reading it once; cached by the file's size and time."""
  del mtime_ns  # part of the cache key only
  ranges, start = [], 0
  try:
    with open(path, "rb") as f:
      while start < size:
        f.seek(start)
        data = f.read(piece_bytes)
        end = start + len(data)
        if not data:
          break
        if end < size:
          line_end = data.rfind(b"\n")
          if line_end >= 0:
            end = start + line_end + 1
          else:  # no line end in the piece: a character it cuts goes to the next
            end = start + character_cut(data)
        ranges.append((start, end))
        start = end
  except OSError as e:
    raise DataError(f"{shown(path)}: cannot read ({e.strerror or e})") from e
  if len(ranges) > 1 and ranges[-1][1] - ranges[-1][0] < piece_bytes // 4:
    ranges[-2:] = [(ranges[-2][0], ranges[-1][1])]
  return tuple(ranges)


# A file that gives fewer documents than this at data.text_files.document_bytes
# (a small file) is cut into this many instead, of at least MIN_PIECE_BYTES
# each: enough for the default batch's 16 rows, each reading its own, and a
# held-out document or two for validation and test.
ENOUGH_PIECES = 32
MIN_PIECE_BYTES = 64
_told: set[tuple[str, int, int, int]] = set()  # the files whose cut was said


def piece_bytes(path: str, document_bytes: int) -> int:
  """The most bytes of a document of the one-file corpus at `path`:
  `document_bytes`, or for a file that gives fewer than ENOUGH_PIECES
  documents at it, the size that cuts it into ENOUGH_PIECES (at least
  MIN_PIECE_BYTES), said once in a line."""
  st = os.stat(path)
  key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, document_bytes)
  if len(_pieces(*key)) >= ENOUGH_PIECES or st.st_size <= MIN_PIECE_BYTES:
    return document_bytes
  smaller = max(MIN_PIECE_BYTES, -(-st.st_size // ENOUGH_PIECES))
  if smaller >= document_bytes:
    return document_bytes
  if key not in _told:
    _told.add(key)
    _log.info(
      "%s (%s bytes) gives %d document(s) of at most data.text_files.document_bytes=%d "
      "bytes: cut into documents of at most %s bytes instead (%d)",
      shown(path),
      f"{st.st_size:,}",
      len(_pieces(*key)),
      document_bytes,
      f"{smaller:,}",
      len(_pieces(*key[:3], smaller)),
    )
  return smaller


def _file_pieces(path: str, document_bytes: int) -> tuple[list[str], tuple[tuple[int, int], ...]]:
  """(names, byte ranges) of the documents of one file (data.text_files.path),
  cut at piece_bytes(path, document_bytes)."""
  check_name(path)
  st = os.stat(path)
  ranges = _pieces(
    os.path.abspath(path), st.st_size, st.st_mtime_ns, piece_bytes(path, document_bytes)
  )
  if st.st_size == 0:
    raise DataError(f"{shown(path)}: the file is empty")
  name = os.path.basename(path)
  width = len(str(len(ranges)))
  return [f"{name}:{i:0{width}d}" for i in range(len(ranges))], ranges


def _one_file_split(c: Config, split: str) -> tuple[list[str], list[tuple[int, int]], str]:
  """(names, byte ranges, text_errors) of one split of a one-file corpus
  (`c`: the section data.text_files)."""
  registry.check_split(split)
  names, ranges = _file_pieces(c.path, c.document_bytes)
  if len(names) < 3:
    raise DataError(
      f"{shown(c.path)} cuts into {len(names)} document(s), even in pieces of "
      f"{MIN_PIECE_BYTES} bytes (the least); splitting needs at least 3: give more text"
    )
  chosen = documents_lib.split_by_hash(names, c.heldout_fraction)[split]
  return [names[i] for i in chosen], [ranges[i] for i in chosen], c.text_errors


def _one_file_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.TextDocuments:
  c = data_config.section(Config)
  names, spans, errors = _one_file_split(c, split)
  path = c.path
  return documents_lib.TextDocuments(
    names=names,
    load_text=lambda i: read_text(path, errors, spans[i]),
    tokenizer=tokenizer,
    description=f"text_files/{split} (pieces of {shown(path)})",
    cache_tokens=data_config.cache_tokens,
  )


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.TextDocuments:
  if os.path.isfile(data_config.section(Config).path or ""):
    return _one_file_documents(data_config, split, tokenizer)
  paths, errors = _split_paths(data_config, split)
  return documents_lib.TextDocuments(
    names=[os.path.basename(p) for p in paths],
    load_text=lambda i: read_text(paths[i], errors),
    tokenizer=tokenizer,
    description=f"text_files/{split}",
    cache_tokens=data_config.cache_tokens,
  )


def check_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer | None = None
) -> int:
  """Reads every file of the split now, as training would later (one file at
  a time, streamed): DataError naming the first file that cannot be read,
  is empty, is not UTF-8 (text_errors='strict') or is too short, or whose
  name cannot be printed. Returns the number of files (of documents, for
  one file cut into them)."""
  c = data_config.section(Config)
  if os.path.isfile(c.path or ""):
    names, spans, errors = _one_file_split(c, split)
    tokenizer = tokenizers.ByteTokenizer() if tokenizer is None else tokenizer
    for name, span in zip(names, spans):
      text = read_text(c.path, errors, span)
      if len(tokenizer.encode(text[: SHORT_CHARS + 1])) < 2:
        raise DataError(f"{name} (a piece of {shown(c.path)}) has fewer than 2 tokens")
    return len(names)
  paths, errors = _split_paths(data_config, split)
  for path in paths:
    check_file(path, errors, tokenizer)
  return len(paths)


def identity(data_config: "DataConfig") -> str:
  """The corpus's files, by split folder, name and size, as a digest (and
  their count and bytes, to read): what a resume compares."""
  c = data_config.section(Config)
  path = c.path
  if os.path.isfile(path):
    listing = [(os.path.basename(path), os.path.getsize(path))]
    digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    size = piece_bytes(path, c.document_bytes)
    cut = "" if size == c.document_bytes else f", pieces of {size} bytes"
    return f"text_files: 1 file, {listing[0][1]} bytes{cut}, sha256 {digest[:16]}"
  if any(os.path.isdir(os.path.join(path, s)) for s in registry.SPLITS):
    folders = [
      os.path.join(path, s) for s in registry.SPLITS if os.path.isdir(os.path.join(path, s))
    ]
  else:
    folders = [path]
  listing = []
  for folder in folders:
    for name in _txt_files(folder):
      listing.append(
        (
          os.path.relpath(os.path.join(folder, name), path),
          os.path.getsize(os.path.join(folder, name)),
        )
      )
  digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
  total = sum(size for _, size in listing)
  return f"text_files: {len(listing)} files, {total} bytes, sha256 {digest[:16]}"


registry.register(
  registry.Source(
    name="text_files",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    check_documents=check_documents,
    identity=identity,
    location_fields=("path",),
  )
)
