"""No input makes a reader loop: every cutter and decoder of a corpus
advances on any bytes, valid or not, and a corpus it cannot read is one
line. Each property is fuzzed (hypothesis) inside a time bound: a loop that
never ends fails the bound instead of hanging the suite."""

import itertools
import os
import struct
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from compressive import data
from compressive.data import books, rdata, text_files, tokenizers
from compressive.errors import DataError
from helpers import data_of
import inprocess

# Far above what each property takes on a loaded 2-core machine (under 10 s
# for 200 examples), far below a hang: a loop is reported, not waited on.
BOUND_S = 120


def within(seconds, fn, *args):
  """fn(*args) in a thread, which must end within `seconds`; its exception
  is raised here. A reader that loops fails this test (its thread, a
  daemon, is left behind) instead of hanging the suite."""
  outcome = {}

  def call():
    try:
      outcome["value"] = fn(*args)
    except BaseException as e:  # handed to the test
      outcome["error"] = e

  thread = threading.Thread(target=call, daemon=True)
  thread.start()
  thread.join(seconds)
  assert not thread.is_alive(), f"{fn.__name__} did not end within {seconds} s: it loops"
  if "error" in outcome:
    raise outcome["error"]
  return outcome.get("value")


_names = itertools.count()


def _corpus(tmp_path, raw: bytes, **fields):
  path = tmp_path / f"input{next(_names)}.txt"  # a new name: _pieces caches by path
  path.write_bytes(raw)
  c = data.default_data_config()
  c.source = "text_files"
  c.text_files.path = str(path)
  for k, v in fields.items():
    c.text_files[k] = v
  return c, path


# -- One lead byte, then continuation bytes alone: cut and named, not looped on. -----

CRAFTED = b"\xc3" + b"\x80" * 40000


def test_a_crafted_one_file_corpus_is_cut_and_named_not_looped_on(tmp_path):
  c, path = _corpus(tmp_path, CRAFTED, document_bytes=16384)
  st = os.stat(path)
  at = (str(path), st.st_size, st.st_mtime_ns)
  assert within(BOUND_S, text_files._pieces, *at, 16384) == (
    (0, 16384),
    (16384, 32768),
    (32768, 40001),
  )
  # Three documents are too few to split well: cut smaller (piece_bytes), as cleanly.
  size = text_files.piece_bytes(str(path), 16384)
  names, ranges = within(BOUND_S, text_files._file_pieces, str(path), 16384)
  assert size < 16384 and len(names) == len(ranges) > 3
  assert ranges == tuple((i, min(i + size, 40001)) for i in range(0, 40001, size))
  for split in data.SPLITS:
    with pytest.raises(
      DataError,
      match=r"input\d+\.txt: invalid UTF-8 at byte \d+ \(invalid "
      r"(start|continuation) byte\)",
    ):
      within(BOUND_S, data.check_documents, data_of(c), split, data.ByteTokenizer())
  # Read with U+FFFD for what is not UTF-8, as text_errors='replace' asks.
  c.text_files.text_errors = "replace"
  docs = within(BOUND_S, data.get_documents, data_of(c), "train", data.ByteTokenizer())
  assert set(docs.text(0)) <= {"\ufffd", "\u00c0"} and len(docs.text(0)) >= size // 2


def test_training_on_the_crafted_corpus_is_one_line_before_any_work(tmp_path):
  c, path = _corpus(tmp_path, CRAFTED * 3)
  within(BOUND_S, text_files._file_pieces, str(path), 1024)  # the loop is not met below
  r = inprocess.run(
    "train.py",
    [
      f"--workdir={tmp_path}/wd",
      "--dry_run",
      "--config.data.source=text_files",
      f"--config.data.text_files.path={path}",
      "--config.data.text_files.document_bytes=1024",
    ],
  )
  assert r.returncode == 2, r.stderr[-3000:]
  [line] = r.stderr.strip().splitlines()
  assert line.startswith(f"error: {path}: invalid UTF-8 at byte "), line
  assert not os.path.lexists(tmp_path / "wd")


# -- The cut of a piece with no line end, fuzzed. ------------------------------------

# Bytes as UTF-8 has them: ASCII, continuation bytes, lead bytes of 2, 3 and 4
# byte characters, and bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5-0xFF).
_BYTE = st.sampled_from(
  [0x41, 0x0A, 0x80, 0xBF, 0xC2, 0xC3, 0xDF, 0xE0, 0xE2, 0xEF, 0xF0, 0xF4, 0xC0, 0xF8, 0xFF]
) | st.integers(0, 255)
_RAW = st.lists(_BYTE, max_size=600).map(bytes)
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)
_FUZZ = settings(
  max_examples=200,
  deadline=None,
  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@given(raw=_RAW.filter(bool))
@settings(_FUZZ)
def test_a_cut_keeps_at_least_one_byte_and_moves_only_the_character_at_the_end(raw):
  end = text_files.character_cut(raw)
  assert 1 <= end <= len(raw)
  if end < len(raw):  # a lead byte and its continuation bytes, at most 4 bytes
    assert len(raw) - end <= 4 and raw[end] >= 0xC0
    assert all(b & 0xC0 == 0x80 for b in raw[end + 1 :])


def _check_pieces(tmp_path, raw, piece):
  _, path = _corpus(tmp_path, raw)
  ranges = text_files._pieces(str(path), len(raw), 0, piece)
  if not raw:
    assert ranges == ()
    return ranges
  assert (ranges[0][0], ranges[-1][1]) == (0, len(raw))
  for (a, b), (c, _) in zip(ranges, ranges[1:]):
    assert a < b == c  # consecutive, each advancing
  return ranges


def test_pieces_advance_on_any_bytes(tmp_path):
  @given(raw=_RAW, piece=st.integers(1, 80))
  @settings(_FUZZ)
  def pieces_of_bytes(raw, piece):
    _check_pieces(tmp_path, raw, piece)

  @given(text=_TEXT, piece=st.integers(4, 80))
  @settings(_FUZZ)
  def pieces_of_text(text, piece):  # and valid UTF-8 is never cut inside a character
    raw = text.encode()
    for a, b in _check_pieces(tmp_path, raw, piece):
      raw[a:b].decode("utf-8")

  within(BOUND_S, pieces_of_bytes)
  within(BOUND_S, pieces_of_text)


def test_every_reader_of_a_one_file_corpus_ends_on_any_bytes(tmp_path):
  # Documents, their check and the corpus's identity, strict and replacing:
  # each ends, by documents or by one line naming the file.
  @given(
    raw=st.lists(_BYTE, min_size=200, max_size=1500).map(bytes),
    errors=st.sampled_from(["strict", "replace"]),
  )
  @settings(_FUZZ, max_examples=60)
  def read(raw, errors):
    c, _ = _corpus(tmp_path, raw, document_bytes=64, text_errors=errors)
    d = data_of(c)
    data.corpus_identity(d)
    try:
      for split in data.SPLITS:
        data.check_documents(d, split, data.ByteTokenizer())
        docs = data.get_documents(d, split, data.ByteTokenizer())
        for i in range(len(docs)):
          docs.num_tokens(i)
    except DataError as e:
      assert "\n" not in str(e)

  within(BOUND_S, read)


# -- The other cutters and decoders of a corpus. -------------------------------------


def test_an_ar_member_of_negative_size_is_refused_not_looped_on():
  member = b"data.tar.xz/".ljust(16) + b" " * 32 + b"-60".ljust(10) + b"`\n"
  with pytest.raises(DataError, match="member header at byte 8 gives the size b'-60'"):
    within(BOUND_S, books.read_ar, b"!<arch>\n" + member * 3)

  @given(raw=st.binary(max_size=400))
  @settings(_FUZZ)
  def any_archive(raw):
    try:
      books.read_ar(b"!<arch>\n" + raw)
    except DataError:
      pass

  within(BOUND_S, any_archive)


def _xdr(*ints):
  return b"X\n" + struct.pack(">iii", 2, 0, 0) + b"".join(struct.pack(">i", i) for i in ints)


def test_an_r_serialisation_with_a_negative_length_is_refused_not_looped_on():
  # A pairlist whose value is an integer vector of length -3: the read of
  # -12 bytes went back onto the pairlist's own flags, forever. A reference
  # to an object never read was an IndexError.
  with pytest.raises(rdata.RFormatError, match="a negative length"):
    within(BOUND_S, rdata.unserialize, _xdr(2, 13, -3))
  with pytest.raises(rdata.RFormatError, match="a reference to object 5 of 0"):
    within(BOUND_S, rdata.unserialize, _xdr(255 | 5 << 8))
  with pytest.raises(rdata.RFormatError, match="nested too deep"):
    within(BOUND_S, rdata.unserialize, _xdr(*[19, 1] * 5000))
  # Found by the fuzzing below: a string that is not UTF-8 was a UnicodeDecodeError.
  with pytest.raises(rdata.RFormatError, match="an R string that is not UTF-8"):
    within(BOUND_S, rdata.unserialize, _xdr(9, 1, -2))

  @given(
    body=st.lists(
      st.sampled_from(
        [-2, -1, 0, 1, 2, 9, 13, 14, 16, 19, 254, 255, 1 << 8 | 1, 2 | 1 << 10, 2 | 1 << 9]
      ),
      max_size=60,
    )
  )
  @settings(_FUZZ)
  def any_stream(body):
    try:
      rdata.unserialize(_xdr(*body))
    except rdata.RFormatError:
      pass

  within(BOUND_S, any_stream)


def test_sentencepiece_pieces_advance_on_any_text():
  with pytest.raises(ValueError, match="max_chars=0 must be >= 1"):
    within(BOUND_S, list, tokenizers._chunks(["some text"], 0))

  @given(texts=st.lists(_TEXT, max_size=4), size=st.integers(1, 40))
  @settings(_FUZZ)
  def chunks(texts, size):
    pieces = list(tokenizers._chunks(texts, size))
    assert all(0 < len(p) <= size and p.strip() for p in pieces)

  within(BOUND_S, chunks)
