"""The user's own corpus: a folder of UTF-8 `*.txt` files, one document each.

Layout, either:
- `<path>/train/*.txt`, `<path>/validation/*.txt`, `<path>/test/*.txt`:
  explicit splits (asking for a split whose folder is missing is an error);
- `<path>/*.txt`: split by document, by a hash of the file name
  (documents.split_by_hash with data.heldout_fraction; at least 3 files).

Files are read lazily, one at a time, and exactly as stored (no newline or
whitespace changes; only a leading byte-order mark is dropped). Invalid
UTF-8 is an error naming the file unless data.text_errors='replace'.
"""

from __future__ import annotations

import os

import ml_collections

from compressive.errors import DataError
from compressive.data import documents as documents_lib
from compressive.data import tokenizers

SPLITS = ('train', 'validation', 'test')


def read_text(path: str, errors: str = 'strict') -> str:
  """The text of one file; invalid UTF-8 raises an error naming the file."""
  if errors not in ('strict', 'replace'):
    raise DataError(
        f"data.text_errors must be 'strict' or 'replace', got {errors!r}")
  with open(path, 'rb') as f:
    raw = f.read()
  try:
    text = raw.decode('utf-8', errors=errors)
  except UnicodeDecodeError as e:
    raise DataError(
        f'{path}: invalid UTF-8 at byte {e.start} ({e.reason}); fix the '
        "file, or set data.text_errors='replace' to read such bytes as "
        'U+FFFD') from e
  return text.removeprefix('\ufeff')


def _txt_files(folder: str) -> list[str]:
  return sorted(n for n in os.listdir(folder)
                if n.endswith('.txt') and os.path.isfile(os.path.join(folder, n)))


def list_split(path: str, split: str, heldout_fraction: float) -> list[str]:
  """Paths of the files of one split, in sorted order."""
  if split not in SPLITS:
    raise DataError(f'split must be one of {SPLITS}, got {split!r}')
  if not path:
    raise DataError('data.source=text_files needs data.path, a folder of '
                     '*.txt files')
  if not os.path.isdir(path):
    raise FileNotFoundError(
        f'data.path {path!r} (text_files) is not an existing folder')
  if any(os.path.isdir(os.path.join(path, s)) for s in SPLITS):
    folder = os.path.join(path, split)
    if not os.path.isdir(folder):
      raise FileNotFoundError(
          f'{path} has split subfolders but no {split!r}: expected '
          f'{folder}/*.txt')
    names = _txt_files(folder)
    if not names:
      raise DataError(f'no *.txt files in {folder}')
    return [os.path.join(folder, n) for n in names]
  names = _txt_files(path)
  if not names:
    raise DataError(
        f'no *.txt files in {path} (and no train/validation/test subfolders)')
  if len(names) < 3:
    raise DataError(
        f'{path} holds {len(names)} *.txt file(s); splitting by document '
        'needs at least 3, or put files in train/, validation/ and test/ '
        'subfolders')
  chosen = documents_lib.split_by_hash(names, heldout_fraction)[split]
  return [os.path.join(path, names[i]) for i in chosen]


def get_documents(data_config: ml_collections.ConfigDict, split: str,
                  tokenizer: tokenizers.Tokenizer
                  ) -> documents_lib.TextDocuments:
  paths = list_split(data_config.path, split, data_config.heldout_fraction)
  errors = data_config.text_errors
  if errors not in ('strict', 'replace'):  # Fail now, not at the first read.
    raise DataError(
        f"data.text_errors must be 'strict' or 'replace', got {errors!r}")
  return documents_lib.TextDocuments(
      names=[os.path.basename(p) for p in paths],
      load_text=lambda i: read_text(paths[i], errors),
      tokenizer=tokenizer,
      description=f'text_files/{split}',
      cache_tokens=data_config.cache_tokens)
