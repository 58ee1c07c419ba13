"""The --config flags' files, for compressive/cli.py: where a config named
without its path is found, which default file a --config loads, and one line
for a config file that cannot be loaded.

Base layer, beside cli.py (which re-exports the public names): it reads the
flags but reports nothing itself, so that cli.parse_flags stays the one place
that prints an error and exits.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Optional

from absl import flags

# The folder holding the compressive package: the repository, or
# site-packages once installed (pyproject.toml installs configs/ beside
# compressive/). Relative default config paths are resolved against it, and
# the shipped configs are found in it by name, so that the entry points work
# from any directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO_ROOT, "configs")

# The default file of each --config style flag (cli.define_config_flag), by
# flag name: loaded only while cli.parse_flags runs.
DEFAULT_CONFIGS: dict[str, str] = {}

# A config named without its path: `--config=enwik8` (or `--config=gpu8:pg19`,
# with get_config's argument) is configs/enwik8.py of this installation.
_CONFIG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def config_names() -> list[str]:
  """The names of the shipped configs (configs/NAME.py), sorted."""
  try:
    files = os.listdir(CONFIG_DIR)
  except OSError:
    return []
  return sorted(f[:-3] for f in files if f.endswith(".py") and not f.startswith("_"))


def resolve_config(value: str) -> str:
  """A --config value whose file part is a bare name (no '.py', no '/', and
  no file of that name in the current directory) with the shipped config's
  path put in; anything else unchanged (a path is relative to the current
  directory, as usual). An unknown name is left as it is, to be reported."""
  path, sep, argument = value.partition(":")
  if _CONFIG_NAME.fullmatch(path) and not os.path.isfile(path):
    shipped = os.path.join(CONFIG_DIR, f"{path}.py")
    if os.path.isfile(shipped):
      return shipped + sep + argument
  return value


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


def _config_given(argv: list[str], name: str) -> bool:
  try:
    expanded = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
  except flags.Error:
    expanded = argv  # reported by the parse itself
  return any(re.match(rf"^-{{1,2}}{re.escape(name)}(=|$)", a) for a in expanded[1:])


def with_default_configs(argv: list[str]) -> list[str]:
  """argv with --config=<default> first where no --config is given (in place
  when argv is sys.argv: ml_collections reads its overrides from sys.argv)."""
  missing = [f"--{name}={path}" for name, path in DEFAULT_CONFIGS.items()
             if name in flags.FLAGS and not _config_given(argv, name)]
  if not missing:
    return argv
  if argv is sys.argv:
    sys.argv[1:1] = missing
    return sys.argv
  return [argv[0], *missing, *argv[1:]]


def config_file_flags() -> list[str]:
  """Names of the --config style flags (ml_collections config files)."""
  return [name for name in flags.FLAGS
          if type(flags.FLAGS[name].parser).__name__ == "ConfigFileFlagParser"]


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
      return (f"--{name}={path}: no such config name ({', '.join(config_names())}) "
              f"or config file (relative to {os.getcwd()})")
    where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
    return f"--{name}={path}: no such config file{where}"
  return f"--{name}={path}: cannot load the config file: {reason}"


def config_file_line(argv: list[str], e: BaseException) -> Optional[str]:
  """'--config=FILE (line N)' if e was raised by the code of a config file."""
  import traceback  # pylint: disable=g-import-not-at-top
  for name in config_file_flags():
    path = config_argument(argv, name)
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if path and os.path.abspath(f.filename) == os.path.abspath(path)]
    if frames:
      return f"--{name}={path} (line {frames[-1].lineno})"
  return None


def unloaded_config(argv: list[str]) -> Optional[str]:
  """One line for the first --config that gave no config, None when all did.
  ml_collections defers a config file's load error to its first use: it is
  found now; and a config file must give a config."""
  for name in config_file_flags():
    value = flags.FLAGS[name].value
    error = getattr(value, "_error", None) if type(value).__name__ == "_ErrorConfig" else None
    if error is not None:
      return load_failure(name, config_argument(argv, name), error)
    if value is None and config_argument(argv, name):
      return f"--{name}={config_argument(argv, name)}: get_config() returned None"
  return None


def parse_failure(argv: list[str], e: BaseException) -> Optional[str]:
  """One line for an exception absl's parse of argv raised: an unknown or
  malformed flag, a missing or broken --config file, a bad --config
  override (ml_collections raises plain exceptions for an unknown field or a
  wrong type, which would otherwise print a traceback), or an exception
  raised by a config file's own code; None for anything else (a bug)."""
  if isinstance(e, flags.Error):
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    required = re.match(r"flag --(\w+)=None: Flag --\1 must have a value other than None", text)
    if required:
      return f"--{required.group(1)} is required"
    if "Error whilst parsing config file" in text:  # get_config raised; lines end with why
      return f"{text.split(': Error whilst', 1)[0].removeprefix('flag ')}: {lines[-1]}"
    return text
  if isinstance(e, SyntaxError):  # a config file that is not Python
    name = next(iter(config_file_flags()), "config")
    return f"--{name}={config_argument(argv, name)}: {e.msg} (line {e.lineno})"
  if isinstance(e, OSError):  # the config file could not be loaded (and an override needs it)
    name = next(iter(config_file_flags()), "config")
    return load_failure(name, config_argument(argv, name), e.__cause__ or e)
  if isinstance(e, (AttributeError, KeyError, TypeError, ValueError)):
    text = " ".join(str(e).replace("\\'", "").replace("\\n", " ").replace("'", "").split())
    override = next((a for a in argv[1:] if a.startswith("--config.")), "a --config override")
    return f"cannot apply {_culprit(argv, text) or override}: {text}"
  where = config_file_line(argv, e)
  return None if where is None else f"{where}: {type(e).__name__}: {e}"


def _culprit(argv: list[str], text: str) -> str:
  """The override whose field the error message names, if one does."""
  for arg in argv[1:]:
    if arg.startswith("--config."):
      name = arg[len("--config."):].split("=", 1)[0]
      if name.split(".")[-1] in text:
        return arg.split("=", 1)[0]
  return ""
