"""Plugins by name: a registered name, or `module:Name` for one defined
outside the package, imported on demand (big_vision's habit). The
compression and data-source registries both look names up here."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from compressive.errors import ConfigError


def lookup(field: str, name: Any, registered: Mapping[str, Any],
           is_kind: Callable[[Any], bool], kind: str) -> Any:
  """`registered[name]`, or for `module:Name` that object of the module,
  imported now (so a config that names it, config.json included, imports it
  again wherever it is read). `field` ("model.compression") names the
  config field; `kind` what the object must be. ConfigError, one line,
  naming the choices or why the outside one cannot be had."""
  where = f"{field}={name!r}"
  if not isinstance(name, str) or ":" not in name:
    if name not in registered:
      raise ConfigError(f"{where} is unknown; choose one of {', '.join(registered)}, "
                        "or module:Name for one defined elsewhere")
    return registered[name]
  module_name, _, attr = name.partition(":")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  # any failure to import is the config's
    raise ConfigError(f"{where}: cannot import module {module_name!r} "
                      f"({type(e).__name__}: {' '.join(str(e).split())}); is it on PYTHONPATH?") from None
  found = getattr(module, attr, None) if attr else None
  if found is None:
    raise ConfigError(f"{where}: module {module_name!r} has no {attr!r}")
  if not is_kind(found):
    raise ConfigError(f"{where}: {attr!r} of {module_name!r} is not {kind}")
  return found
