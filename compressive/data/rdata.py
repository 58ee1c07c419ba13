"""A small reader for R's serialisation format and lazy-load databases.

Just enough of R's XDR serialisation (R Internals, "Serialization formats")
to read the data a CRAN package ships in `data/Rdata.rdx` / `Rdata.rdb`:
NULL, symbols, pairlists, character / logical / integer / double vectors and
lists, with attributes. Used to take Jane Austen's novels out of Debian's
`r-cran-janeaustenr` without R. Anything else raises a clear error.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import lzma
import struct
from typing import Any, Callable
import zlib

import numpy as np

# SEXP types (R Internals, "SEXPTYPEs") and serialisation pseudo-types.
_SYMSXP, _LISTSXP, _LANGSXP = 1, 2, 6
_CHARSXP, _LGLSXP, _INTSXP, _REALSXP = 9, 10, 13, 14
_STRSXP, _VECSXP, _EXPRSXP = 16, 19, 20
_ATTRLANGSXP, _ATTRLISTSXP = 240, 239
_REFSXP, _NILVALUE_SXP = 255, 254
_SPECIALS = {
  253: "GlobalEnv",
  252: "UnboundValue",
  251: "MissingArg",
  250: "BaseNamespace",
  242: "EmptyEnv",
  241: "BaseEnv",
}
_PAIRLISTS = (_LISTSXP, _LANGSXP, _ATTRLANGSXP, _ATTRLISTSXP)

_HAS_ATTR, _HAS_TAG = 1 << 9, 1 << 10
_UTF8, _LATIN1, _BYTES, _ASCII = 1 << 3, 1 << 2, 1 << 1, 1 << 6


@dataclasses.dataclass
class RObject:
  """An R value with its attributes (e.g. names) as a dict."""

  value: Any
  attributes: dict[str, Any]


@dataclasses.dataclass
class Symbol:
  name: str


class RFormatError(ValueError):
  pass


class _Reader:
  """Reads one XDR ('X\\n') serialised R object."""

  def __init__(self, data: bytes):
    self._data = data
    self._pos = 0
    self._refs: list[Any] = []

  def _take(self, n: int) -> bytes:
    if n < 0:  # a length the stream gives: negative ones would read backwards, forever
      raise RFormatError(f"a negative length ({n}) in the R serialisation")
    if self._pos + n > len(self._data):
      raise RFormatError("truncated R serialisation")
    out = self._data[self._pos : self._pos + n]
    self._pos += n
    return out

  def _int(self) -> int:
    return struct.unpack(">i", self._take(4))[0]

  def _length(self) -> int:
    n = self._int()
    if n == -1:  # Long vector: two more ints.
      hi, lo = self._int(), self._int()
      n = (hi << 32) + lo
    return n

  def read(self) -> Any:
    if self._take(2) != b"X\n":
      raise RFormatError("only the XDR binary serialisation is supported")
    version = self._int()
    self._int()  # Writer's R version.
    self._int()  # Minimal reader version.
    if version == 3:
      self._take(self._int())  # Native encoding name.
    elif version != 2:
      raise RFormatError(f"unsupported serialisation version {version}")
    return self._item()

  def _item(self) -> Any:
    flags = self._int()
    kind = flags & 0xFF
    if kind == _NILVALUE_SXP:
      return None
    if kind in _SPECIALS:
      return Symbol(_SPECIALS[kind])
    if kind == _REFSXP:
      index = flags >> 8
      if index == 0:
        index = self._int()
      if not 1 <= index <= len(self._refs):
        raise RFormatError(f"a reference to object {index} of {len(self._refs)} read")
      return self._refs[index - 1]
    if kind == _SYMSXP:
      symbol = Symbol(self._item())
      self._refs.append(symbol)
      return symbol
    if kind in _PAIRLISTS:
      return self._pairlist(flags)
    if kind == _CHARSXP:
      return self._string(flags)
    value: list[Any] | np.ndarray
    if kind in (_STRSXP, _VECSXP, _EXPRSXP):
      value = [self._item() for _ in range(self._length())]
    elif kind in (_LGLSXP, _INTSXP):
      n = self._length()
      value = np.frombuffer(self._take(4 * n), ">i4").astype(np.int32)
    elif kind == _REALSXP:
      n = self._length()
      value = np.frombuffer(self._take(8 * n), ">f8").astype(np.float64)
    else:
      raise RFormatError(f"unsupported R object type {kind}")
    if flags & _HAS_ATTR:
      return RObject(value, self._attributes())
    return value

  def _string(self, flags: int) -> str | None:
    n = self._int()
    if n == -1:
      return None  # NA_character_.
    raw = self._take(n)
    levels = flags >> 12
    if levels & _LATIN1:
      return raw.decode("latin-1")
    if levels & _BYTES:
      raise RFormatError('R "bytes"-encoded strings are not supported')
    try:
      return raw.decode("utf-8")  # UTF-8, ASCII, or native (UTF-8 on Debian).
    except UnicodeDecodeError as e:
      raise RFormatError(f"an R string that is not UTF-8 ({e.reason} at byte {e.start})") from None

  def _pairlist(self, flags: int) -> RObject:
    items: list[tuple[str | None, Any]] = []
    attributes: dict[str, Any] = {}
    while True:
      if flags & _HAS_ATTR:
        attributes.update(self._attributes())
      tag = self._item() if flags & _HAS_TAG else None
      items.append((tag.name if isinstance(tag, Symbol) else None, self._item()))
      flags = self._int()
      if flags & 0xFF == _NILVALUE_SXP:
        return RObject(items, attributes)
      if flags & 0xFF not in _PAIRLISTS:
        raise RFormatError("malformed pairlist")

  def _attributes(self) -> dict[str, Any]:
    pairs = self._item()
    if not isinstance(pairs, RObject):
      raise RFormatError("attributes must be a pairlist")
    return dict(pairs.value)


def unserialize(data: bytes) -> Any:
  """Reads one object in R's XDR serialisation (as written by serialize()).
  Every read takes bytes of `data` from the front, so any bytes end in an
  object or an RFormatError."""
  try:
    return _Reader(data).read()
  except RecursionError:
    raise RFormatError("R objects nested too deep") from None


def read_rds(data: bytes) -> Any:
  """Reads the contents of an .rds / .rdx file (gzip-compressed or not)."""
  if data[:2] == b"\x1f\x8b":
    data = gzip.decompress(data)
  return unserialize(data)


def named_list(obj: Any) -> dict[str, Any]:
  """An R list with names, as a dict."""
  if not isinstance(obj, RObject) or "names" not in obj.attributes:
    raise RFormatError("expected a named R list")
  return dict(zip(obj.attributes["names"], obj.value))


def read_lazyload_db(rdx: bytes, rdb: bytes) -> dict[str, Any]:
  """All variables of an R lazy-load database (a package's data/Rdata.*).

  The .rdx index names each variable's (offset, length) in the .rdb file;
  each blob there is a 4-byte big-endian uncompressed size followed by the
  compressed serialisation (zlib; or, with compression type 2 or 3, a type
  byte and then zlib 'Z', bzip2 '2', xz 'X' or none '0').
  """
  index = named_list(read_rds(rdx))
  compression = int(np.asarray(index.get("compressed", [1])).reshape(-1)[0])
  out = {}
  for name, where in named_list(index["variables"]).items():
    offset, length = (int(x) for x in np.asarray(where).reshape(-1)[:2])
    blob = rdb[offset : offset + length]
    size = struct.unpack(">I", blob[:4])[0]
    body = blob[4:]
    if compression in (2, 3):
      kind, body = body[:1], body[1:]
      decompressors: dict[bytes, Callable[[bytes], bytes]] = {
        b"Z": zlib.decompress,
        b"2": bz2.decompress,
        b"X": lzma.decompress,
        b"0": bytes,
      }
      data = decompressors[kind](body)
    else:
      data = zlib.decompress(body)
    if len(data) != size:
      raise RFormatError(f"R object {name!r}: size mismatch")
    out[name] = unserialize(data)
  return out
