"""One file of the user's own corpus (compressive/data/text_files.py) read
as training reads it: exactly as stored (only a leading byte-order mark is
dropped), whole or one piece of it; its name printable UTF-8, and invalid
UTF-8 (unless text_errors='replace'), an unreadable or empty file, or a text
too short to predict, a DataError naming the file (and the byte)."""

from __future__ import annotations

import codecs
import os

from compressive.data import tokenizers
from compressive.errors import DataError

TEXT_ERRORS = ("strict", "replace")


def read_text(path: str, errors: str = "strict", span: tuple[int, int] | None = None) -> str:
  """The text of one file, or of its bytes [start, end) (`span`: a piece of
  one file cut into documents); an unreadable file or invalid UTF-8 raises a
  DataError naming the file (and the byte of the file)."""
  if errors not in TEXT_ERRORS:
    raise DataError(f"data.text_files.text_errors must be 'strict' or 'replace', got {errors!r}")
  start = 0 if span is None else span[0]
  try:
    with open(path, "rb") as f:
      f.seek(start)
      raw = f.read() if span is None else f.read(span[1] - start)
  except OSError as e:
    raise DataError(f"{shown(path)}: cannot read ({e.strerror or e})") from e
  try:
    text = raw.decode("utf-8", errors=errors)
  except UnicodeDecodeError as e:
    raise DataError(_invalid_utf8(path, start + e.start, e.reason)) from e
  return text.removeprefix("\ufeff") if start == 0 else text


def shown(path: str) -> str:
  """The path as it can be printed: bytes that are not UTF-8 as \\xNN, and
  quoted with escapes if it holds unprintable characters (a newline)."""
  try:
    path.encode("utf-8")
  except UnicodeEncodeError:
    path = os.fsencode(path).decode("utf-8", errors="backslashreplace")
  return path if path.isprintable() else repr(path)


def _invalid_utf8(path: str, offset: int, reason: str) -> str:
  return (
    f"{shown(path)}: invalid UTF-8 at byte {offset} ({reason}); fix the file, or set "
    "data.text_files.text_errors='replace' to read such bytes as U+FFFD"
  )


def check_name(path: str) -> None:
  """DataError unless the file name is valid UTF-8 and printable (it is
  shown in logs and errors, and hashed to choose the split)."""
  name = os.path.basename(path)
  try:
    name.encode("utf-8")
  except UnicodeEncodeError:
    raise DataError(f"{shown(path)}: the file name is not valid UTF-8; rename the file") from None
  if not name.isprintable():
    raise DataError(f"{shown(path)}: the file name has unprintable characters; rename the file")


# Texts up to this many characters are tokenized to count their tokens; a
# longer one has at least 2 with any tokenizer here (a SentencePiece piece
# spans at most 16 characters).
SHORT_CHARS = 64


def check_file(
  path: str,
  errors: str = "strict",
  tokenizer: tokenizers.Tokenizer | None = None,
  chunk_bytes: int = 1 << 20,
) -> None:
  """Reads one file as training will, streaming (never whole in memory):
  DataError naming it unless it can be read, decodes as UTF-8 (with
  errors='strict') and has at least 2 tokens (1 prediction).

  Without a tokenizer, tokens are counted as the bytes tokenizer does; only
  short texts are tokenized (SHORT_CHARS).
  """
  check_name(path)
  decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)
  size = chars = 0
  started = False
  short: list[str] | None = []  # the text read so far, while the file is short enough to tokenize
  try:
    with open(path, "rb") as f:
      while True:
        chunk = f.read(chunk_bytes)
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the last chunk
        try:
          text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as e:
          raise DataError(_invalid_utf8(path, size - pending + e.start, e.reason)) from e
        if not started and text:  # the first character: a byte-order mark is dropped
          text, started = text.removeprefix("\ufeff"), True
        size += len(chunk)
        chars += len(text)
        if short is not None:
          short.append(text)
          if chars > SHORT_CHARS:
            short = None
        if not chunk:
          break
  except OSError as e:
    raise DataError(f"{shown(path)}: cannot read ({e.strerror or e})") from e
  if size == 0:
    raise DataError(f"{shown(path)}: the file is empty; remove it")
  if short is not None:
    ids = (tokenizers.ByteTokenizer() if tokenizer is None else tokenizer).encode("".join(short))
    if len(ids) < 2:
      raise DataError(
        f"{shown(path)}: the text has {len(ids)} token(s); a document needs at least 2 "
        "to give one prediction. Remove or extend it."
      )
