"""The tools' side of tests/tools/test_docs.py: which flags each entry point takes,
and whether the docs' commands parse, found by the tools' own code.

Run as `python tests/tools/docs_worker.py` from the repository root, with a JSON
request on stdin: {"tools": [path, ...], "commands": {path: [[arg, ...], ...]}}.
Prints one JSON object as the last line of stdout:
{"tools": {path: {"names", "booleans", "config_flags", "results"} or {"error"}},
 "fields": {"fields": [every field path of every config in configs/]} or {"error"}},
where "results" holds, for each command in order, {"error": None or the
tool's one line}.

JAX and the libraries are imported once, here; then each tool gets a forked
process of its own (two tools define the same flags, e.g. --workdir), which
runs the script as `__main__` with `absl.app.run` (or argparse's parse) made
to stop it: so its flags are defined exactly as when a user runs it, those
defined under `if __name__ == "__main__"` included, and nothing runs. Each
command is parsed in a process forked from that one, with the tool's own
parser (`cli.parse_flags`, absl's, or the script's argparse parser), so that
one command's flags and --config overrides never leak into the next.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import runpy
import sys
import traceback
from typing import Any, Callable

# The repository root, from where this script is (tests/tools/); run by path, it
# imports nothing of the tests (helpers.py would import the package too early).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A value that stands for one the reader chooses: $VARS, <name>, `...`, and
# words in capitals (DIR, N, HOST:PORT, START,END, configs/X.py).
PLACEHOLDER = re.compile(r"\$|\.\.\.|<[^>]*>|(?<![A-Za-z0-9])[A-Z][A-Z0-9_]*(?![A-Za-z0-9])")

# Imported once, before the forks, so that each tool's process finds them
# loaded (the slow part: JAX); none of them defines a flag of a tool.
PRELOADED = (
  "jax",
  "flax",
  "optax",
  "orbax.checkpoint",
  "absl.app",
  "ml_collections.config_flags",
  "compressive",
)

# Flags that act while they are parsed (print help and exit, read a file):
# commands using them are checked by flag names only.
ACTING_FLAGS = frozenset(("help", "helpfull", "helpshort", "helpxml", "flagfile", "h"))


def is_placeholder(value: str) -> bool:
  return bool(PLACEHOLDER.search(value))


# -- Processes. ----------------------------------------------------------------


def fork(fn: Callable[[], Any]) -> tuple[int, int]:
  """Runs fn() in a forked process; (pid, fd) for `collect`."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child: its result (or its failure) as JSON, then out
    os.close(read)
    try:
      result = fn()
    except BaseException as e:
      result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=-3)}
    with os.fdopen(write, "w") as f:
      json.dump(result, f)
    os._exit(0)
  os.close(write)
  return pid, read


def collect(child: tuple[int, int]) -> Any:
  pid, read = child
  with os.fdopen(read) as f:
    data = f.read()
  _, status = os.waitpid(pid, 0)
  return json.loads(data) if data else {"error": f"the process died (status {status})"}


# -- Loading a tool. -------------------------------------------------------------


class _Stopped(BaseException):
  """Raised where the script would parse its command line."""


def load_tool(tool: str) -> tuple[str, Any]:
  """Runs the script as `python TOOL` would, up to its parse: ("absl", the
  flags parser app.run was given) or ("argparse", the parser)."""
  from absl import app

  def stop_app_run(main, argv=None, flags_parser=app.parse_flags_with_usage):
    del main, argv
    raise _Stopped("absl", flags_parser)

  def stop_argparse(parser, args=None, namespace=None):
    del args, namespace
    raise _Stopped("argparse", parser)

  saved = app.run, argparse.ArgumentParser.parse_known_args
  app.run, argparse.ArgumentParser.parse_known_args = stop_app_run, stop_argparse
  sys.argv[:] = [tool]
  sys.path.insert(0, os.path.dirname(os.path.join(REPO, tool)))
  try:
    runpy.run_path(os.path.join(REPO, tool), run_name="__main__")
  except _Stopped as stopped:
    kind, parser = stopped.args
  else:
    raise RuntimeError(f"{tool} reads no command line (neither absl.app.run nor argparse)")
  finally:
    app.run, argparse.ArgumentParser.parse_known_args = saved
  if kind == "absl":
    app.define_help_flags()  # as app.run does before it parses
  return kind, parser


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
  actions = parser._actions
  return {o: a for a in actions for o in a.option_strings}


def flag_names(kind: str, parser: Any) -> dict[str, list[str]]:
  if kind == "argparse":
    return {
      "names": sorted(o[2:] for o in _options(parser) if o.startswith("--")),
      "booleans": [],
      "config_flags": [],
    }
  from absl import flags

  fv = flags.FLAGS
  return {
    "names": sorted(fv),
    "booleans": sorted(n for n in fv if fv[n].boolean),
    "config_flags": sorted(n for n in fv if type(fv[n].parser).__name__ == "ConfigFileFlagParser"),
  }


def report_tool(tool: str, commands: list[list[str]]) -> dict[str, Any]:
  kind, parser = load_tool(tool)
  report = flag_names(kind, parser)
  report["results"] = [
    collect(fork(lambda args=args: parse_command(tool, kind, parser, args))) for args in commands
  ]
  return report


# -- Parsing one command. ---------------------------------------------------------


def _valid_value(flag: Any, value: str) -> str:
  """A value of the flag's type for a placeholder: a text flag keeps it (any
  text parses), a typed one gets its smallest valid value or first choice."""
  parser = type(flag.parser).__name__
  if flag.boolean:
    return "true"
  if parser in ("IntegerParser", "FloatParser"):
    low = flag.parser.lower_bound
    return str(low if low is not None else 1)
  if parser == "EnumParser":
    return flag.parser.enum_values[0]
  if parser == "EnumClassParser":
    return next(iter(flag.parser.enum_class.__members__))
  if parser == "ConfigFileFlagParser":  # the tool's default config, else the default experiment
    defaults = getattr(sys.modules.get("compressive.cli_config"), "DEFAULT_CONFIGS", {})
    return defaults.get(flag.name, os.path.join(REPO, "configs", "default.py"))
  return value


def _absl_args(args: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """args with placeholder values made type-valid, and the --config.a.b
  overrides whose value is a placeholder taken out: (flag, field) pairs,
  whose field is checked to exist once the config is loaded."""
  from absl import flags

  fv = flags.FLAGS
  out, fields = [], []
  for arg in args:
    m = re.fullmatch(r"--?([\w.-]+)=(.*)", arg, re.S)
    if not m or not is_placeholder(m.group(2)):
      out.append(arg)
      continue
    name, value = m.groups()
    head, _, field = name.partition(".")
    if field and head in fv and type(fv[head].parser).__name__ == "ConfigFileFlagParser":
      fields.append((head, field))
    else:
      out.append(f"--{name}={_valid_value(fv[name], value)}" if name in fv else arg)
  return out, fields


def _has_field(config: Any, path: str) -> bool:
  for part in path.split("."):
    try:
      config = config[part]
    except (KeyError, TypeError, AttributeError):
      if not hasattr(config, part):
        return False
      config = getattr(config, part)
  return True


def _argparse_args(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
  options = _options(parser)
  out = []
  for arg in args:
    name, eq, value = arg.partition("=")
    action = options.get(name)
    if eq and action is not None and is_placeholder(value):
      if action.choices:
        value = str(action.choices[0])
      elif action.type in (int, float):
        value = "1"
    out.append(name + eq + value)
  return out


def _error_line(text: str) -> str:
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  errors = [line for line in lines if "error" in line.lower()]
  return (errors or lines or ["exited without a message"])[0]


def parse_command(tool: str, kind: str, parser: Any, args: list[str]) -> dict[str, Any]:
  """{"error": None} when the tool accepts args, else its one line; with
  "names_only" when a flag that acts while parsed stopped a full parse."""
  names = {re.sub(r"^--?|=.*", "", a, flags=re.S) for a in args if a.startswith("-")}
  if names & ACTING_FLAGS:
    return {"error": None, "names_only": True}
  cli = sys.modules.get("compressive.cli")
  if cli is not None:  # no compilation cache folder is made for a parse
    cli.use_compilation_cache = lambda flag: None
  fields = []
  stderr = io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
      if kind == "argparse":
        parser.parse_args(_argparse_args(parser, args))
      else:
        args, fields = _absl_args(args)
        sys.argv[:] = [tool, *args]  # ml_collections reads its overrides from sys.argv
        parser(sys.argv)
  except SystemExit:
    return {"error": _error_line(stderr.getvalue())}
  from absl import flags

  for flag, field in fields:
    if not _has_field(flags.FLAGS[flag].value, field):
      return {"error": f"--{flag}.{field}: no such field in the config"}
  return {"error": None}


# -- Config fields. ------------------------------------------------------------------


def config_fields() -> list[str]:
  """Every field path (sections too) of every config in configs/ (with
  get_config's default argument) and of the data section with all sources."""
  import ml_collections

  from compressive.data import config as data_config

  fields = set()

  def walk(config, prefix):
    for key, value in config.items():
      fields.add(prefix + key)
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, f"{prefix}{key}.")

  for name in sorted(
    f[:-3]
    for f in os.listdir(os.path.join(REPO, "configs"))
    if f.endswith(".py") and not f.startswith("_")
  ):
    module = importlib.import_module(f"compressive.configs.{name}")
    if hasattr(module, "get_config"):
      walk(module.get_config(), "")
  walk(data_config.default_data_config(), "data.")
  return sorted(fields)


def main() -> None:
  request = json.load(sys.stdin)
  os.chdir(REPO)
  sys.path[0] = REPO  # as `python train.py` from the repository root: this tree's package
  for name in PRELOADED:
    importlib.import_module(name)
  children = {
    tool: fork(lambda tool=tool: report_tool(tool, request["commands"].get(tool, [])))
    for tool in request["tools"]
  }
  fields = fork(lambda: {"fields": config_fields()})
  result = {
    "tools": {tool: collect(child) for tool, child in children.items()},
    "fields": collect(fields),
  }
  print(json.dumps(result))


if __name__ == "__main__":
  main()
