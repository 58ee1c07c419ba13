"""The one way to parse JSON that a run or an export holds: config.json,
export.json, the metrics files' lines and the checkpoints' integrity records.

Any failure to parse is damage, named in one line (DamagedJSONError, a
CheckpointError): bytes that are not UTF-8 or not JSON, brackets nested
deeper than MAX_DEPTH (Python's own parser gives up with a RecursionError
near a thousand, and any code that walks the value after it might too), an
integer beyond Python's int-string limit (a ValueError), a value of another
type than the file holds (a list where a mapping belongs). What a caller
does with damage is its own: the trainer sets a side file aside (or leaves
a metrics line out) and goes on; a reader refuses in one line (exit 2).
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from compressive import files
from compressive.errors import CheckpointError

# No file the package writes nests deeper than a few levels (config.json's
# sections, an export's identity).
MAX_DEPTH = 32


class DamagedJSONError(CheckpointError):
  """A file (or a line of one) that cannot be parsed as the JSON it holds;
  `path` and `cause` for callers that word their own message."""

  def __init__(self, path: str, cause: str):
    super().__init__(f"{path} is damaged ({cause})")
    self.path, self.cause = path, cause


def _finite_or_null(text: str) -> Optional[float]:
  value = float(text)
  return value if math.isfinite(value) else None


def _decode(data: str | bytes, nonfinite_as_null: bool) -> Any:
  if isinstance(data, bytes):
    data = data.decode("utf-8")
  if nonfinite_as_null:  # NaN, Infinity and a float that overflows, as null
    return json.loads(data, parse_constant=lambda _: None, parse_float=_finite_or_null)
  return json.loads(data)


def _cause(e: Exception) -> str:
  if isinstance(e, RecursionError):
    return f"it nests brackets more than {MAX_DEPTH} deep"
  if isinstance(e, UnicodeDecodeError):
    return f"not UTF-8: byte {e.start} ({e.reason})"
  first = str(e).splitlines()[0] if str(e) else type(e).__name__
  return first[:200]


def depth(value: Any) -> int:
  """How deep `value`'s lists and mappings nest (0: a scalar), found
  without recursion."""
  deepest, stack = 0, [(value, 1)]
  while stack:
    item, level = stack.pop()
    children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
    if children is None:
      continue
    deepest = max(deepest, level)
    stack.extend((child, level + 1) for child in children)
  return deepest


_KINDS = {
  dict: "a mapping",
  list: "a list",
  str: "a string",
  bool: "true or false",
  int: "a number",
  float: "a number",
  type(None): "null",
}


def parse(
  data: str | bytes, path: str, kind: Optional[type] = dict, *, nonfinite_as_null: bool = False
) -> Any:
  """The JSON value `data` holds (the text of `path`, or one line of it),
  of type `kind` (None: any); DamagedJSONError naming `path` and the cause
  for anything else. `nonfinite_as_null`: NaN, Infinity and numbers beyond
  a float read as null (what the metrics files write for them)."""
  try:
    value = _decode(data, nonfinite_as_null)
  except (ValueError, RecursionError) as e:  # JSON's, UTF-8's, the int-string limit's
    raise DamagedJSONError(path, _cause(e)) from None
  if depth(value) > MAX_DEPTH:
    raise DamagedJSONError(path, f"it nests brackets more than {MAX_DEPTH} deep")
  if kind is not None and not isinstance(value, kind):
    raise DamagedJSONError(
      path,
      f"it holds {_KINDS.get(type(value), type(value).__name__)}, "
      f"not {_KINDS.get(kind, kind.__name__)}",
    )
  return value


def read(path: str, kind: Optional[type] = dict, limit: int = 64 << 20) -> Any:
  """parse() of the regular file at `path`, never read through a link or
  past `limit` bytes (files.read_bytes): a link, a folder, a FIFO or a
  larger file is damage too. OSError as open() raises it for a missing or
  unreadable file."""
  try:
    data = files.read_bytes(path, limit)
  except files.NotAFileError as e:
    raise DamagedJSONError(path, e.what) from None
  return parse(data, path, kind)
