"""The --config flags' files, for compressive/cli.py: where a config named
without its path is found, which default file a --config loads, how an
override is read, and one line for a config file or override that cannot be
loaded, named where it failed (the file's own line, or the override).

One rule for every override (cli_overrides.install_override_rules): the
last value given of a repeated --config.X wins, for tuples, lists, strings,
numbers, booleans and fields that are None alike. A data source named
`module:Name` on the command line (--config.data.source) is imported while
the config is read, so that its section, data.<name>, is there for its own
fields' overrides; a source named only by the config file is not imported
here.

Base layer, beside cli.py (the tools import it themselves): it reports
nothing itself; cli.parse_flags is the one place that prints an error and
exits. What the parse of a command line raised is described by
compressive/cli_parse_errors.py.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Any, Optional

from absl import flags

from compressive import configs as _shipped_configs
from compressive import plugins
from compressive.errors import ConfigError

# The shipped configs' folder: the package compressive.configs, the repository's
# configs/ (pyproject.toml maps the one to the other), where default config
# files and configs named without a path are found, from any directory.
CONFIG_DIR = os.path.abspath(list(_shipped_configs.__path__)[0])

# The default file of each --config style flag (cli.define_config_flag), by
# flag name: loaded only while cli.parse_flags runs.
DEFAULT_CONFIGS: dict[str, str] = {}

# A config named without its path: `--config=enwik8` (or `--config=gpu8:pg19`,
# with get_config's argument) is configs/enwik8.py of this installation.
_CONFIG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def config_names() -> list[str]:
  """The names of the shipped configs (configs/NAME.py defining
  `get_config`; paper.py, what the paper's configs share, is none), sorted."""
  try:
    files = os.listdir(CONFIG_DIR)
  except OSError:
    return []
  return sorted(
    f[:-3]
    for f in files
    if f.endswith(".py")
    and not f.startswith("_")
    and _defines_get_config(os.path.join(CONFIG_DIR, f))
  )


def _defines_get_config(path: str) -> bool:
  try:
    with open(path, encoding="utf-8") as f:
      return "\ndef get_config(" in f.read()
  except (OSError, UnicodeDecodeError):
    return False


def resolve_config(value: str) -> str:
  """A --config value whose file part is a bare name (no '.py', no '/', and
  no file of that name in the current directory) with the shipped config's
  path put in; anything else unchanged (a path is relative to the current
  directory, as usual). An unknown name is left as it is, to be reported."""
  path, sep, argument = value.partition(":")
  if _CONFIG_NAME.fullmatch(path) and not os.path.isfile(path):
    shipped = os.path.join(CONFIG_DIR, f"{path}.py")
    if os.path.isfile(shipped) and _defines_get_config(shipped):
      return shipped + sep + argument
  return value


def shown_config(path: str) -> str:
  """A --config value as messages name it: a bare name that a file of the
  current folder answered instead of the shipped config (resolve_config)."""
  name = path.partition(":")[0]
  if not (
    _CONFIG_NAME.fullmatch(name)
    and os.path.isfile(name)
    and os.path.isfile(os.path.join(CONFIG_DIR, f"{name}.py"))
  ):
    return path
  return (
    f"{path} (the file {os.path.abspath(name)} in the current folder, read instead of the "
    f"shipped config {name})"
  )


def resolve_config_names(argv: list[str]) -> list[str]:
  """argv with every --config=NAME (also `--config NAME`) given as the
  shipped config's path (in place when argv is sys.argv, as
  with_default_configs)."""
  names = config_file_flags()
  out = list(argv)
  for i in range(1, len(out)):
    if out[i] == "--":
      break
    for name in names:
      m = re.match(rf"^(-{{1,2}}{re.escape(name)})(=(.*))?$", out[i])
      if m and m.group(2):
        out[i] = f"{m.group(1)}={resolve_config(m.group(3))}"
      elif m and i + 1 < len(out) and not out[i + 1].startswith("-"):
        out[i + 1] = resolve_config(out[i + 1])
  if out == argv:
    return argv
  if argv is sys.argv:
    sys.argv[:] = out
    return sys.argv
  return out


def _config_values(argv: list[str], name: str) -> list[str]:
  """The values given to --NAME (`--NAME=V` or `--NAME V`), flag files
  expanded, up to a `--`."""
  try:
    expanded = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
  except flags.Error:
    expanded = argv  # reported by the parse itself
  given = []
  for i, arg in enumerate(expanded[1:], start=1):
    if arg == "--":
      break
    m = re.match(rf"^-{{1,2}}{re.escape(name)}(=(.*))?$", arg)
    if m:
      given.append(m.group(2) if m.group(1) else (expanded[i + 1] if i + 1 < len(expanded) else ""))
  return given


def _config_given(argv: list[str], name: str) -> bool:
  return bool(_config_values(argv, name))


def with_default_configs(argv: list[str]) -> list[str]:
  """argv with --config=<default> first where no --config is given (in place
  when argv is sys.argv: ml_collections reads its overrides from sys.argv)."""
  missing = [
    f"--{name}={path}"
    for name, path in DEFAULT_CONFIGS.items()
    if name in flags.FLAGS and not _config_given(argv, name)
  ]
  if not missing:
    return argv
  if argv is sys.argv:
    sys.argv[1:1] = missing
    return sys.argv
  return [argv[0], *missing, *argv[1:]]


def config_file_flags() -> list[str]:
  """Names of the --config style flags (ml_collections config files)."""
  return [
    name
    for name in flags.FLAGS
    if any(k.__name__ == "ConfigFileFlagParser" for k in type(flags.FLAGS[name].parser).__mro__)
  ]


def _expanded(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
  except flags.Error:
    return argv  # reported by the parse itself


def overridden_fields(argv: list[str], name: str = "config") -> set[str]:
  """The fields the command line overrides, as dotted paths
  (`--config.data.text_files.path=...` -> data.text_files.path; booleans'
  `--noconfig.x` too), flag files expanded, up to a `--`."""
  fields = set()
  for a in _expanded(argv)[1:]:
    if a == "--":
      break
    m = re.match(rf"^-{{1,2}}(?:no)?{re.escape(name)}\.([\w.]+)(=|$)", a)
    if m:
      fields.add(m.group(1))
  return fields


def command_line_source(argv: list[str], name: str = "config") -> Optional[str]:
  """The last --NAME.data.source=VALUE (or `--NAME.data.source VALUE`) of argv."""
  value = None
  for i, a in enumerate(argv[1:], 1):
    if a == "--":
      break
    m = re.match(rf"^-{{1,2}}{re.escape(name)}\.data\.source(=(.*))?$", a)
    if m:
      value = m.group(2) if m.group(1) else (argv[i + 1] if i + 1 < len(argv) else None)
  return value


def add_plugin_section(config: Any, source: Optional[str]) -> None:
  """Adds data.<name>, at its defaults, for `source`, a data source named
  `module:Name` on the command line (imported now), unless the config has
  it already: its fields can then be overridden. ConfigError (one line) when
  the source cannot be had."""
  data: Any = config.get("data") if hasattr(config, "unlocked") else None
  if not source or ":" not in source or not hasattr(data, "unlocked"):
    return
  found = plugins.lookup(
    "data.source",
    source,
    {},
    lambda s: isinstance(getattr(s, "name", None), str) and callable(getattr(s, "schema", None)),
    "a compressive.data.registry.Source",
  )
  if found.name in data:
    return
  try:
    section = dataclasses.asdict(found.schema())
  except Exception as e:  # the plugin's
    raise ConfigError(
      f"data.source={source!r}: its schema's defaults raised "
      f"{type(e).__name__}: {' '.join(str(e).split())}"
    ) from None
  with data.unlocked():
    data[found.name] = section


def config_file_parser(
  base: type, name: str, sys_argv: Optional[list[str]] = None
) -> flags.ArgumentParser:
  """`base`, ml_collections' parser of a --NAME config file (its
  ConfigFileFlagParser), that also adds the section of a data source the
  command line (sys_argv, default sys.argv) names as `module:Name`
  (add_plugin_section), before the overrides are applied."""

  class ConfigFileFlagParser(base):  # its name, as tools read it (config_file_flags)
    def parse(self, path: str) -> Any:
      config = super().parse(path)
      argv = _expanded(sys.argv if sys_argv is None else sys_argv)
      add_plugin_section(config, command_line_source(argv, name))
      return config

  return ConfigFileFlagParser(name=name, lock_config=True)


def config_argument(argv: list[str], name: str) -> str:
  """The config file path as given (the last --config=...), or its default."""
  value = None
  args = argv[1:]
  for i, a in enumerate(args):
    m = re.match(rf"^-{{1,2}}{re.escape(name)}(=(.*))?$", a)
    if m:
      value = m.group(2) if m.group(1) else (args[i + 1] if i + 1 < len(args) else "")
  if value is None:
    value = (flags.FLAGS[name].default_as_str or "").strip("'") if name in flags.FLAGS else ""
  return value.split(":", 1)[0]


def load_failure(name: str, path: str, error: BaseException) -> str:
  """One line for a config file that could not be loaded."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  reason = lines[-1] if lines else type(error).__name__
  reason = re.sub(r"^\[Errno \d+\] ", "", reason)
  if "No such file or directory" in reason:
    if _CONFIG_NAME.fullmatch(path):
      return (
        f"--{name}={path}: no such config name ({', '.join(config_names())}) "
        f"or config file (relative to {os.getcwd()})"
      )
    where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
    shipped = _shipped_name(path)
    hint = f"; the shipped config of that name is --{name}={shipped}" if shipped else ""
    return f"--{name}={path}: no such config file{where}{hint}"
  return f"--{name}={shown_config(path)}: cannot load the config file: {reason}"


def _shipped_name(path: str) -> Optional[str]:
  """NAME, when `path` is `configs/NAME.py` (a checkout's path, as the
  guides once wrote it) and NAME a shipped config: after `pip install` the
  configs are named without their folder (--config=NAME)."""
  folder, file = os.path.split(os.path.normpath(path))
  name = file[:-3] if file.endswith(".py") else ""
  if os.path.basename(folder) == "configs" and name in config_names():
    return name
  return None


def is_config_dict(value: Any) -> bool:
  """Whether a --config flag's value (or a section of it) is an
  ml_collections config, as get_config returns."""
  import ml_collections

  return isinstance(value, ml_collections.ConfigDict)  # frozen ones are too


def repeated_config(argv: list[str]) -> Optional[str]:
  """One line for a --config style flag given more than once: each file
  defines the overrides of its own fields, so only one can be read."""
  for name in config_file_flags():
    given = _config_values(argv, name)
    if len(given) > 1:
      return (
        f"--{name} is given {len(given)} times ({', '.join(given)}); give one config "
        f"file, and change its fields with --{name}.FIELD=VALUE"
      )
  return None
