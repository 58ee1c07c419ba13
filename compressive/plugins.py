"""Plugins by name: a registered name, or `module:Name` for one defined
outside the package, imported on demand (big_vision's habit). The
compression and data-source registries both look names up here.

A saved config (a workdir's config.json, an export's) never imports code on
its own say-so: while one is read (`saved_config()`: compressive.load and
the tools that read a run), `module:Name` resolves only a module already
imported, by the user's own code or by `trust` (the tools' --plugin flag,
compressive.load's `plugins`), and no data source downloads or prepares
anything. A config the user gives (train.py's --config) imports what it
names, as before."""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any, Callable, Iterable, Iterator, Mapping

from compressive.errors import ConfigError


def lookup(
  field: str, name: Any, registered: Mapping[str, Any], is_kind: Callable[[Any], bool], kind: str
) -> Any:
  """`registered[name]`, or for `module:Name` that object of the module,
  imported now (so a config that names it, config.json included, imports it
  again wherever it is read). `field` ("model.compression") names the
  config field; `kind` what the object must be. ConfigError, one line,
  naming the choices or why the outside one cannot be had."""
  where = f"{field}={name!r}"
  if not isinstance(name, str) or ":" not in name:
    if name not in registered:
      raise ConfigError(
        f"{where} is unknown; choose one of {', '.join(registered)}, "
        "or module:Name for one defined elsewhere"
      )
    return registered[name]
  module_name, _, attr = name.partition(":")
  if _reading_saved[0] and module_name not in sys.modules:
    raise ConfigError(
      f"{where}: module {module_name!r} is not imported, and a saved config (config.json, "
      f"an export) never imports code itself: if you trust it, name it with "
      f"--plugin={module_name} (compressive.load(..., plugins=[{module_name!r}]))"
    )
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # any failure to import is the config's
    raise ConfigError(
      f"{where}: cannot import module {module_name!r} "
      f"({type(e).__name__}: {' '.join(str(e).split())}); "
      "is it on PYTHONPATH?"
    ) from None
  found = getattr(module, attr, None) if attr else None
  if found is None:
    raise ConfigError(f"{where}: module {module_name!r} has no {attr!r}")
  if not is_kind(found):
    raise ConfigError(f"{where}: {attr!r} of {module_name!r} is not {kind}")
  return found


_reading_saved = [0]  # how many saved_config() blocks are open


def reading_saved_config() -> bool:
  """Whether a saved config is being read (within `saved_config`)."""
  return bool(_reading_saved[0])


@contextlib.contextmanager
def saved_config() -> Iterator[None]:
  """Within it, `lookup` imports no module: a `module:Name` a saved config
  names resolves only when its module is already imported (`trust`); and
  no data source downloads or prepares anything (data.registry.may_write)."""
  _reading_saved[0] += 1
  try:
    yield
  finally:
    _reading_saved[0] -= 1


def trust(modules: Iterable[str]) -> None:
  """Imports the plugin modules the user named (--plugin, compressive.load's
  `plugins`), so that a saved config may name their objects; ConfigError,
  one line, for one that cannot be imported."""
  for module_name in modules:
    try:
      importlib.import_module(module_name)
    except Exception as e:  # the user's module
      raise ConfigError(
        f"--plugin={module_name}: cannot import it ({type(e).__name__}: "
        f"{' '.join(str(e).split())}); is it on PYTHONPATH?"
      ) from None
