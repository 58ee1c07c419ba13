"""Values checked as the program will use them: one rule for every number a
user can type, a config field or a tool's flag.

A float the device computes with is a float32: a value that is finite in
Python may overflow to inf there (1e39), underflow to 0 (1e-300) or round
onto the edge of its range (b2 = 0.9999999999 becomes 1.0). `number` checks
a value as that dtype holds it, against its range written as an interval
("[0, 1)", "(0, inf]"), and returns it; a config group checks every float
field it has this way (`check_fields`: against its declared range, or,
declared by its annotation alone, against float32's), so that a new field
is checked without being listed anywhere. An integer is checked by
`integer` against its interval too (e.g. a seed against the 32 bits a PRNG
key holds).

Every failure is a ConfigError whose one line names the field (or flag),
the value as typed, what the dtype made of it, and the range.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from typing import Any, Mapping, TypeVar
import warnings

import numpy as np

from compressive.errors import ConfigError

_INTERVAL = re.compile(r"^\s*([\[(])\s*([^,]+?)\s*,\s*([^\]\)]+?)\s*([\])])\s*$")


_POWER = re.compile(r"^(-?)2\*\*(\d+)(?:-(\d+))?$")


def _exact_bound(text: str) -> int | float:
  """A bound of an interval, exactly: an int for an integer or (-)2**N (- K),
  else a float (+-inf too)."""
  text = text.replace(" ", "")
  power = _POWER.match(text)
  if power:
    sign, exponent, less = power.groups()
    return (-1 if sign else 1) * 2 ** int(exponent) - int(less or 0)
  return int(text) if re.fullmatch(r"-?\d+", text) else float(text)


def _bound(text: str) -> float:
  return float(_exact_bound(text))


def parse_interval(interval: str) -> tuple[float, bool, float, bool]:
  """ "[0, 1)" -> (0.0, True, 1.0, False): (low, low included, high, high
  included); "inf" and "-inf" as bounds, "2**31" or "2**32 - 2" as powers
  of two (less an integer)."""
  match = _INTERVAL.match(interval)
  if not match:
    raise ValueError(f"not an interval: {interval!r}")
  left, low, high, right = match.groups()
  return _bound(low), left == "[", _bound(high), right == "]"


def in_interval(value: float, interval: str) -> bool:
  low, low_in, high, high_in = parse_interval(interval)
  above = value >= low if low_in else value > low
  below = value <= high if high_in else value < high
  return above and below


def as_dtype(value: float, dtype: str) -> float:
  """`value` as `dtype` ("float32", "bfloat16" or "float64") holds it."""
  if dtype == "float64":
    return float(value)
  import ml_dtypes  # JAX's own dependency

  np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
  with warnings.catch_warnings(), np.errstate(over="ignore", under="ignore"):
    warnings.simplefilter("ignore")
    return float(np.asarray(value, np.float64).astype(np_dtype))


def _smallest_normal(dtype: str) -> float:
  if dtype == "float64":
    return float(np.finfo(np.float64).tiny)
  import ml_dtypes

  return float(ml_dtypes.finfo(np.float32 if dtype == "float32" else ml_dtypes.bfloat16).tiny)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
    value, (bool, np.bool_)
  )


def number(
  name: str, value: Any, interval: str = "(-inf, inf)", *, dtype: str = "float32", must: str = ""
) -> float:
  """`value` as `dtype` holds it, checked: a number (not NaN), which the
  dtype neither overflows to inf nor underflows to 0 (or a subnormal, which
  accelerators flush to 0), and whose dtype value lies in `interval`.
  ConfigError `NAME=VALUE ...` otherwise; `must` replaces the interval in
  the message (e.g. "a finite number > 0")."""
  must = must or f"a number in {interval}"
  if not _is_number(value) or math.isnan(value):
    raise ConfigError(f"{name}={value!r} must be {must}")
  held = as_dtype(value, dtype)
  if math.isinf(held) and not math.isinf(value):
    raise ConfigError(
      f"{name}={value!r} overflows to {held} in {dtype} (the dtype it has on the device; "
      f"its largest is {_largest(dtype):.4g}): it must be {must}"
    )
  if value != 0 and abs(held) < _smallest_normal(dtype):
    what = "0" if held == 0 else f"the subnormal {held:.3g}, which accelerators flush to 0,"
    raise ConfigError(
      f"{name}={value!r} underflows to {what} in {dtype} (the dtype it has on the device; "
      f"its smallest normal number is {_smallest_normal(dtype):.4g}): it must be {must}"
    )
  if not in_interval(held, interval):
    rounded = (
      f" (it is {held!r} in {dtype}, the dtype it has on the device)" if (held != value) else ""
    )
    raise ConfigError(f"{name}={value!r}{rounded} must be {must}")
  return held


def _largest(dtype: str) -> float:
  if dtype == "float64":
    return float(np.finfo(np.float64).max)
  import ml_dtypes

  return float(ml_dtypes.finfo(np.float32 if dtype == "float32" else ml_dtypes.bfloat16).max)


def integer(name: str, value: Any, interval: str, *, must: str = "") -> int:
  """`value`, an integer (not a bool) in `interval`; ConfigError otherwise."""
  must = must or f"an integer in {interval}"
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise ConfigError(f"{name}={value!r} must be {must}")
  low, low_in, high, high_in = parse_interval(interval)
  # Compared as integers (a float bound of 2**63 would round a neighbour onto it).
  low_ok = math.isinf(low) or (
    value >= _int_bound(interval, 0) if low_in else value > _int_bound(interval, 0)
  )
  high_ok = math.isinf(high) or (
    value <= _int_bound(interval, 1) if high_in else value < _int_bound(interval, 1)
  )
  if not (low_ok and high_ok):
    raise ConfigError(f"{name}={value!r} must be {must}")
  return int(value)


def _int_bound(interval: str, which: int) -> int | float:
  """The low (0) or high (1) bound of `interval` exactly (an int when it is one).
  Only for an interval that parse_interval has accepted."""
  match = _INTERVAL.match(interval)
  assert match is not None
  return _exact_bound(match.group(2 + which))


# -- Config groups: dataclasses whose fields declare their ranges. ------------------
#
# Every group (a frozen dataclass: the model, training, optimizer,
# evaluation, mesh and data sections, and each data source's section)
# declares each field once: its default, its kind and its range or choices,
# with the helpers below. A field declared without them (a plugin source's
# schema) is checked by its annotation's kind (int, float, str, bool,
# tuple). `from_dict` builds a group from its section: a key it does not
# know, a field it requires that is missing and a value of another kind are
# each a ConfigError naming the field, before the group checks its ranges
# and the rules between its fields (`__post_init__`, `check_fields`).

# The kinds a field may have, as an annotation names them.
KINDS = ("int", "float", "str", "bool", "tuple")
_WORDS = {
  "int": "an integer",
  "float": "a number",
  "str": "a string",
  "bool": "True or False",
  "tuple": "a tuple",
}


def _declared(
  kind: str, default: Any, interval: str = "", must: str = "", choices: Any = (), rule: Any = None
) -> Any:
  metadata = {"kind": kind, "must": must}
  if interval:
    metadata["interval"] = interval
  if choices:
    metadata["choices"] = choices
  if rule:
    metadata["rule"] = rule
  return dataclasses.field(default=default, metadata=metadata)


def whole(default: Any, interval: str, must: str = "") -> Any:
  """A dataclass field holding an integer in `interval` (`integer`),
  checked by the group's `__post_init__` (`check_fields`); `must` is the
  error's wording of the range. `dataclasses.MISSING` as the default: a
  field the section must give."""
  return _declared("int", default, interval, must)


def real(default: Any, interval: str, must: str = "") -> Any:
  """A dataclass field holding a number in `interval` as float32 holds it
  (`number`), checked like `whole`'s."""
  return _declared("float", default, interval, must)


def text(default: Any, choices: Any = (), must: str = "") -> Any:
  """A dataclass field holding a string, one of `choices` when given (a
  tuple, or a function returning one, for choices a registry below this
  layer holds); `must` is the error's wording of the choices."""
  return _declared("str", default, must=must, choices=choices)


def flag(default: bool) -> Any:
  """A dataclass field holding True or False."""
  return _declared("bool", default)


def sequence(default: Any, must: str = "", rule: Any = None) -> Any:
  """A dataclass field holding a tuple (a list as JSON gives it is read as one);
  `rule`, a function of the tuple, says what is wrong with its items: the
  words of the error after the field's name (e.g. "=('a', 'a') must be
  distinct names"), or "" when nothing is."""
  return _declared("tuple", default, must=must, rule=rule)


def kind_of(f: dataclasses.Field) -> str:
  """A field's kind: as declared, else as its annotation names it (int,
  float, str, bool, tuple, tuple[...]); "" for any other annotation (a
  nested group, a mapping, Any), which is not checked here."""
  if "kind" in f.metadata:
    return f.metadata["kind"]
  name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
  name = name.split("[", 1)[0].strip()
  return name if name in KINDS else ""


def _choices(f: dataclasses.Field) -> Any:
  """A string field's declared choices (a tuple, or a registry's function
  giving one); () for none."""
  choices = f.metadata.get("choices", ())
  return choices() if callable(choices) else choices


def describe(f: dataclasses.Field) -> str:
  """What a field holds, from its declaration alone: its kind and its range
  or choices (e.g. "an integer in [1, 2**31)", "one of 'adam', 'adamw'"),
  as the docs' tables list it."""
  kind = kind_of(f)
  if kind in ("int", "float") and "interval" in f.metadata:
    return f"{_WORDS[kind]} in {f.metadata['interval']}"
  choices = _choices(f)
  if kind == "str" and choices:
    return "one of " + ", ".join(repr(c) for c in choices)
  return _WORDS.get(kind, "a section")


def _is_kind(value: Any, kind: str) -> bool:
  if kind == "int":
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
  if kind == "float":
    return _is_number(value)
  if kind == "str":
    return isinstance(value, str)
  if kind == "bool":
    return isinstance(value, (bool, np.bool_))
  return isinstance(value, (tuple, list))


def _shown(value: Any) -> str:
  text = " ".join(repr(value).split())
  return text if len(text) <= 80 else text[:77] + "..."


def check_kind(f: dataclasses.Field, value: Any, prefix: str) -> None:
  """ConfigError naming `PREFIXfield` unless `value` is of the field's kind
  (kind_of) and, for a string with choices, one of them."""
  kind = kind_of(f)
  if not kind:
    return
  if not _is_kind(value, kind):
    what = f.metadata.get("must") if kind in ("str", "tuple") else ""
    raise ConfigError(
      f"{prefix}{f.name}={_shown(value)} must be {what or _WORDS[kind]}"
      + (f", not {type(value).__name__}" if value is not None else ", not null")
    )
  choices = _choices(f)
  if kind == "str" and choices:
    if value not in choices:
      must = f.metadata.get("must")
      raise ConfigError(
        f"{prefix}{f.name}={value!r} "
        + (f"must be {must}" if must else f"is unknown; choose one of {', '.join(choices)}")
      )


def check_fields(group: Any, prefix: str) -> dict[str, Any]:
  """Every field of `group` against its kind (check_kind) and its declared
  range or rule (a float declared by its annotation alone: against what
  float32 holds), in field order; ConfigError naming `PREFIXfield`.
  Returns {field: the value as checked} of the fields with a range and the
  floats (a float as float32 holds it)."""
  held = {}
  for f in dataclasses.fields(group):
    if f.metadata.get("derived"):
      continue
    value = getattr(group, f.name)
    check_kind(f, value, prefix)
    problem = f.metadata["rule"](value) if "rule" in f.metadata else ""
    if problem:
      raise ConfigError(f"{prefix}{f.name}{problem}")
    if "interval" in f.metadata:
      check = integer if f.metadata["kind"] == "int" else number
      held[f.name] = check(prefix + f.name, value, f.metadata["interval"], must=f.metadata["must"])
    elif kind_of(f) == "float":  # no range of its own: as float32 holds it (an inf typed as inf)
      held[f.name] = number(
        prefix + f.name, value, "[-inf, inf]", must="a number that float32 holds"
      )
  return held


def check_section(cls: Any, section: Any, prefix: str, derived: Any = ()) -> None:
  """ConfigError naming the first key of `section` (a mapping) that `cls`,
  a group, does not know, the first field it requires that the section
  lacks, or the first value of another kind than its field's (kind_of):
  what `from_dict` checks before the group is made, and what a saved
  file's reader checks of each section it holds (`derived`: fields that
  come from other groups, never from the section)."""
  if not isinstance(section, Mapping):
    raise ConfigError(
      f"{prefix.rstrip('.') or 'the config'} must be a section of fields, "
      f"not {'null' if section is None else type(section).__name__}"
    )
  fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in derived}
  unknown = sorted(str(k) for k in section if k not in fields)
  if unknown:
    key = unknown[0][:80] if unknown[0][:80].isprintable() else repr(unknown[0][:80])
    raise ConfigError(
      f"{prefix}{key} is not a field of this "
      f"version's config ({prefix.rstrip('.') or 'top level'}: "
      f"{', '.join(sorted(fields))})"
    )
  for name, f in fields.items():
    if name in section:
      check_kind(f, section[name], prefix)
    elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
      raise ConfigError(f"{prefix}{name} is missing from the config")


G = TypeVar("G")  # a group's dataclass


def from_dict(cls: type[G], section: Any, prefix: str, **derived: Any) -> G:
  """`cls` (a group's dataclass) from its config section (a mapping, or
  what has to_dict), each value as written, checked first (check_section:
  a field it does not know, one it lacks that has no default, a value of
  another kind are each a ConfigError naming the field; `derived` fields
  come from other groups, never from the section); the group then checks
  its ranges and its rules as it is made, and each field is checked here
  too (check_fields), for a schema declared by annotations, which has no
  __post_init__ of its own."""
  if hasattr(section, "to_dict"):
    section = section.to_dict()
  check_section(cls, section, prefix, tuple(derived))
  group = cls(**section, **derived)
  check_fields(group, prefix)  # a schema by annotations has no __post_init__ to do it
  return group


def to_dict(group: Any) -> dict[str, Any]:
  """A group's fields as its config section holds them (derived ones left
  out; nested groups as sections)."""
  out = {}
  for f in dataclasses.fields(group):
    if f.metadata.get("derived"):
      continue
    value = getattr(group, f.name)
    out[f.name] = to_dict(value) if dataclasses.is_dataclass(value) else value
  return out


# -- Durations as the logs show them. -----------------------------------------------


def hms(seconds: float) -> str:
  """A duration as H:MM:SS (whole seconds; a negative one as 0:00:00): the
  ETAs and totals of evaluation's progress lines and training's log."""
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# -- Progress and metrics as the logs show them. ------------------------------------


class Progress:
  """Progress lines for long first-use work (generating a corpus): the first
  after `after` seconds, then one every `every` seconds, on the
  "compressive" logger (`what`: 12,000 of 40,960 (29%), about 0:01:10
  left); none for work done sooner."""

  def __init__(self, what: str, total: int, after: float = 5.0, every: float = 15.0):
    self.what, self.total, self.every, self.done = what, total, every, 0
    self.start = time.monotonic()
    self.next = self.start + after

  def advance(self, n: int = 1) -> None:
    self.done += n
    now = time.monotonic()
    if now < self.next or not self.total:
      return
    self.next = now + self.every
    left = (now - self.start) * (self.total - self.done) / max(self.done, 1)
    logging.getLogger("compressive").info(
      "%s: %s of %s (%d%%), about %s left",
      self.what,
      f"{self.done:,}",
      f"{self.total:,}",
      100 * self.done // self.total,
      hms(left),
    )


def metrics_text(metrics: dict[str, Any], sep: str = " ") -> str:
  """Metrics for a log line: `name value` pairs (or `name=value`, sep "="),
  counts as integers (`tokens 20480`), the rest to four decimals."""

  def text(v: Any) -> str:
    v = float(v)
    return f"{v:.0f}" if v.is_integer() else f"{v:.4f}"

  return "  ".join(f"{k}{sep}{text(v)}" for k, v in metrics.items())
