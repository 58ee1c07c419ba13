"""Nested values walked whole: a config (ml_collections', mappings, JSON) as
its dotted keys, and a tool's result (dicts, lists and numbers) as valid JSON,
whose NaN and infinite floats are named (`non_finite`) or made JSON's null
(`finite_or_null`), since NaN and Infinity are not JSON."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
  """A nested config (ConfigDict, mappings, JSON) -> {"dotted.key": leaf
  value}, each key after `prefix`; an empty section leaves no key.

  A flat dict comes back as it is (its keys may already hold dots).
  """
  if hasattr(config, "to_dict"):  # ml_collections (Frozen)ConfigDict
    config = config.to_dict()
  out: dict[str, Any] = {}
  for k, v in config.items():
    key = f"{prefix}{k}"
    if hasattr(v, "to_dict") or isinstance(v, Mapping):
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


def non_finite(value: Any, prefix: str = "") -> list[str]:
  """The names (dotted, [i] for items) of the NaN or infinite floats in a
  result of dicts, lists and numbers."""
  if isinstance(value, dict):
    return [n for k, v in value.items() for n in non_finite(v, f"{prefix}{k}.")]
  if isinstance(value, (list, tuple)):
    return [n for i, v in enumerate(value) for n in non_finite(v, f"{prefix.rstrip('.')}[{i}].")]
  if isinstance(value, (float, np.floating)) and not math.isfinite(value):
    return [f"{prefix.rstrip('.')}={value}"]
  return []


def finite_or_null(value: Any) -> Any:
  """The result with each NaN or infinite float as None (JSON's null): what
  JSON can hold, since NaN and Infinity are not JSON."""
  if isinstance(value, dict):
    return {k: finite_or_null(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite_or_null(v) for v in value]
  if isinstance(value, (float, np.floating)) and not math.isfinite(value):
    return None
  return value
