"""One line for what the parse of a tool's command line raised or left
behind, for cli.parse_flags: an unknown or malformed flag, a flag's own
check, a --config file that is missing, is not Python, raised, or gave no
config, and a --config override that names no field or a value of the wrong
type, each named where it failed (the file's own line, or the override);
None for anything else, which is a bug and keeps its traceback.

Base layer, beside cli_config.py, which finds and loads the config files:
it reports nothing itself; cli.parse_flags is the one place that prints an
error and exits.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from absl import flags

from compressive.cli_config import (
  config_argument,
  config_file_flags,
  is_config_dict,
  load_failure,
  shown_config,
)


def config_file_line(argv: list[str], e: BaseException) -> Optional[str]:
  """'--config=FILE (line N)' if e was raised by the code of a config file."""
  import traceback

  for name in config_file_flags():
    path = config_argument(argv, name)
    frames = [
      f
      for f in traceback.extract_tb(e.__traceback__)
      if path and os.path.abspath(f.filename) == os.path.abspath(path)
    ]
    if frames:
      return f"--{name}={shown_config(path)} (line {frames[-1].lineno})"
  return None


def unloaded_config(argv: list[str]) -> Optional[str]:
  """One line for the first --config that gave no config (ml_collections
  defers a file's load error to its first use: found now), None when all did."""
  for name in config_file_flags():
    value, path = flags.FLAGS[name].value, config_argument(argv, name)
    error = getattr(value, "_error", None) if type(value).__name__ == "_ErrorConfig" else None
    if error is not None:
      return load_failure(name, path, error)
    if value is None and path:
      return f"--{name}={shown_config(path)}: get_config() returned None"
    if value is not None and not is_config_dict(value):
      return (
        f"--{name}={shown_config(path)}: get_config() returned a {type(value).__name__}; "
        "a config file's get_config returns an ml_collections config"
      )
  return None


def parse_failure(argv: list[str], e: BaseException) -> Optional[str]:
  """One line for what absl's parse of argv raised: an unknown or malformed
  flag, a missing or broken --config file, a bad --config override
  (ml_collections raises plain exceptions), or an exception raised by a
  config file's own code; None for anything else (a bug)."""
  user = _user_error(e)
  if user is not None:  # e.g. a plugin the command line names cannot be had
    return str(user)
  if isinstance(e, flags.Error):
    return _flag_error_line(e)
  if isinstance(e, SyntaxError):  # a config file that is not Python
    name = next(iter(config_file_flags()), "config")
    return f"--{name}={shown_config(config_argument(argv, name))}: {e.msg} (line {e.lineno})"
  if isinstance(e, OSError):  # the config file could not be loaded (and an override needs it)
    name = next(iter(config_file_flags()), "config")
    return load_failure(name, config_argument(argv, name), e.__cause__ or e)
  where = config_file_line(argv, e)  # raised by a config file's own code: named there
  lookup = isinstance(e, (AttributeError, KeyError, TypeError, ValueError))
  text = " ".join(
    str(e).replace("\\'", "").replace("\\n", " ").replace("'", "").split()
    if lookup
    else str(e).split()
  )
  if lookup and where is None:
    missing = _no_such_field(argv, text) if isinstance(e, (AttributeError, KeyError)) else None
    if missing is not None:
      return missing
    override = next((a for a in argv[1:] if a.startswith("--config.")), None)
    name = next(iter(config_file_flags()), "config")
    if override is None or "has no attribute get_config" in text:  # the file's, then
      return f"--{name}={shown_config(config_argument(argv, name))}: {text}"
    return f"cannot apply {_culprit(argv, text) or override}: {text}"
  clipped = text if len(text) <= 300 else text[:297] + "..."  # a locked config lists its fields
  return None if where is None else f"{where}: {type(e).__name__}: {clipped}"


def _flag_error_line(e: flags.Error) -> str:
  """One line for absl's own parse error: a required flag not given, a flag's
  own check failing, a config file's get_config raising, or an unknown flag
  (named as the config field it spells, where one does); else absl's first
  line."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  text = lines[0] if lines else type(e).__name__
  required = re.match(r"flag --(\w+)=None: Flag --\1 must have a value other than None", text)
  if required:
    return f"--{required.group(1)} is required"
  # A flag's own check (cli_flags.validate_int_flag ...): its line, which names
  # the flag and its value, without absl's `flag --name=VALUE: ` before it.
  checked = re.match(r"flag --(\w+)=.*?: (--\1=.*)$", text)
  if checked:
    return checked.group(2)
  if "Error whilst parsing config file" in text:  # get_config raised; lines end with why
    return f"{text.split(': Error whilst', 1)[0].removeprefix('flag ')}: {lines[-1]}"
  unknown = re.match(r"Unknown command line flag '([\w.-]+)'", text)
  field = _config_field_named(unknown.group(1)) if unknown else None
  if field is not None:  # absl would suggest a flag of a similar spelling instead
    assert unknown is not None  # field was looked up by its name
    return (
      f"Unknown command line flag '{unknown.group(1)}': a config field is set with --{field}=VALUE"
    )
  return text


def _config_field_named(name: str) -> Optional[str]:
  """`config.PATH` of the one field of a loaded --config whose last name is
  `name` (the default config's, if none was loaded), else None."""
  for flag in config_file_flags():
    config = flags.FLAGS[flag].value
    if not is_config_dict(config):
      continue
    found: list[str] = []
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
      prefix, node = stack.pop()
      for key, value in node.items():
        if is_config_dict(value):
          stack.append((f"{prefix}{key}.", value))
        elif key == name:
          found.append(f"{flag}.{prefix}{key}")
    if len(found) == 1:
      return found[0]
  return None


def _culprit(argv: list[str], text: str) -> str:
  """The override whose field the error message names, if one does."""
  for arg in argv[1:]:
    if arg.startswith("--config."):
      name = arg[len("--config.") :].split("=", 1)[0]
      if name.split(".")[-1] in text:
        return arg.split("=", 1)[0]
  return ""


def _user_error(e: Optional[BaseException]) -> Optional[BaseException]:
  """e or the exception it was raised from or during, if a UserError."""
  from compressive.errors import UserError

  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, UserError):
      return e
    e = e.__cause__ or e.__context__
  return None


def _no_such_field(argv: list[str], text: str) -> Optional[str]:
  """'cannot apply --config.a.b.c: the config has no field a.b' when the
  message of ml_collections' lookup error (text) starts with a field name
  of an override's path."""
  key = re.match(r"\W*(\w+)", text)
  for arg in argv[1:] if key else ():
    m = re.match(r"^--(?:no)?config\.([\w.]+)", arg)
    parts = m.group(1).split(".") if m else []
    assert key is not None  # the loop runs only for a key
    if key.group(1) not in parts:
      continue
    assert m is not None  # parts, which hold the key, came from it
    at = parts.index(key.group(1))
    line = (
      f"cannot apply --config.{m.group(1)}: the config has no field {'.'.join(parts[: at + 1])}"
    )
    guess = re.search(r'Did you mean "(\w+)"', text)
    if guess:
      line += f" (did you mean {'.'.join(parts[:at] + [guess.group(1)])}?)"
    if parts[0] == "data" and at == 1 and len(parts) > 2:
      line += (
        "; a data source defined outside the package has its section data.<name> once "
        "the command line names it: --config.data.source=module:Name"
      )
    return line
  return None
