"""What the entry points share: user errors as one line and exit code 2.

A user's mistake (a flag, a config field, an override, a corpus, a
checkpoint) or the environment's (a full disk, a read-only or unwritable
folder, a workdir that is a file) is printed as one line `error: ...` with
exit code 2 and no traceback; anything else is a bug and keeps its
traceback. The library never reads flags: this module only turns its
exceptions into exits (the flags' own ranges are checked as they are parsed).

Every entry point parses its flags with `parse_flags` and runs all its work
inside `with user_errors():`. `parse_flags` also finds a config named without
its path (`--config=enwik8`: configs/enwik8.py) and turns on JAX's persistent
compilation cache (`--compilation_cache`, default ~/.cache/compressive/jax).
The flags several entry points share (--workdir, --step, the multi-host,
memory and split flags) are defined once each, with their checks, by
compressive/cli_flags.py; the --config files by compressive/cli_config.py;
the environment's OSErrors, as one line each, by compressive/cli_os_errors.py.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import sys
import textwrap
import time
from typing import Any, Callable, Iterator, Mapping, NoReturn, Optional

from absl import app, flags

from compressive import cli_config, cli_os_errors, cli_parse_errors, cli_xla, files, remote, storage
from compressive.cli_overrides import install_override_rules
from compressive.errors import EXIT_USER_ERROR, NonFiniteError, UserError, stopping_on_signals


def one_line(message: str) -> str:
  """The message's lines joined by '; ' (by ' ' after a colon)."""
  out = ""
  for line in str(message).splitlines():
    line = line.strip()
    if line:
      out += ("" if not out else " " if out.endswith(":") else "; ") + line
  return out


def fail(message: str, code: int = EXIT_USER_ERROR) -> NoReturn:
  sys.stdout.flush()
  print(f"error: {one_line(message)}", file=sys.stderr)
  sys.exit(code)


class ConsoleFormatter(logging.Formatter):
  """The tools' log lines on the console: `12:04:31 message`, and
  `12:04:31 warning: message` for a warning or worse; absl's own prefix
  (level, date, thread id, file and line) only at --verbosity=1 and up."""

  def format(self, record: logging.LogRecord) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
    text = f"{stamp} {level}{record.getMessage()}"
    if record.exc_info:
      text += "\n" + self.formatException(record.exc_info)
    return text


def debug_verbosity() -> bool:  # -v 1 or more asks for absl's debug output
  return bool(
    "verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present and flags.FLAGS.verbosity >= 1
  )


def quiet_libraries() -> None:
  """Orbax and TensorStore log at absl's INFO and WARNING, and log a
  traceback from their threads for a read that a rotating trainer raced or
  a write the disk refused; the tools report those themselves, in one line.
  Only absl's FATAL gets through, and the tools' own lines carry a short
  prefix (ConsoleFormatter), unless --verbosity asks for debug output:
  then everything, as absl writes it."""
  from absl import logging as absl_logging

  if debug_verbosity():
    return
  absl_logging.set_verbosity(absl_logging.FATAL)
  absl_logging.get_absl_handler().setFormatter(ConsoleFormatter())
  # Cloud Storage's clients (remote.py): their INFO lines, and the errors
  # (with tracebacks) that remote.StorageError reports in one line.
  for name in ("fsspec", "gcsfs"):
    logging.getLogger(name).setLevel(logging.CRITICAL)


def warn(message: str) -> None:
  print(f"warning: {one_line(message)}", file=sys.stderr)


def report_result(result: Any, warning: Optional[str], /, **saved: Optional[str]) -> None:
  """A tool's result as its command says it: the JSON line on stdout (NaN
  refused: ValueError), then on stderr the warning, or where each part was
  saved (`figure=PATH`: `figure: PATH`)."""
  print(json.dumps(result, allow_nan=False), flush=True)
  if warning is not None:
    warn(warning)
  for label, path in saved.items():
    if path is not None:
      print(f"{label}: {path}", file=sys.stderr)


def save_result(result: Any, path: str, public: Callable[[str], str] = str) -> Optional[str]:
  """A tool's result saved at `path` whole (files.write_json, which refuses
  NaN, ValueError, before anything is written: nested.finite_or_null makes
  it null). None once saved; else the warning the tool gives when the
  workdir cannot be written (naming the path by `public`: a mirror's by
  its URL, layout.Workdir.public), the result, which the tool prints,
  losing nothing."""
  try:
    files.write_json(path, result)
  except OSError as e:
    return f"the result is printed but not saved: cannot write {public(path)}: {e.strerror or e}"
  return None


# -- Environment errors. -------------------------------------------------------


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
  """Turns UserError, an environment OSError (a missing file, a full disk, a
  read-only or unwritable path, a file where a folder should be) and a
  non-finite loss (exit code 1) into one line; anything else propagates."""
  try:
    yield
  except UserError as e:
    fail(str(e) or type(e).__name__)
  except Exception as e:
    if isinstance(e, NonFiniteError):
      fail(str(e), code=1)
    message = cli_os_errors.describe_os_error(e) or describe_backend_error(e)
    if message is None:
      raise
    fail(message)


def describe_backend_error(error: BaseException) -> Optional[str]:
  """One line for JAX failing to start the platform it was asked for
  (JAX_PLATFORMS=cuda without the CUDA plugin: JAX's own error is a bare
  AssertionError deep in xla_bridge); None for any other error."""
  import traceback

  frames = traceback.extract_tb(error.__traceback__)
  if not any(
    f.filename.endswith("xla_bridge.py") and f.name in ("backends", "_init_backend") for f in frames
  ):
    return None
  asked = os.environ.get("JAX_PLATFORMS", "")
  detail = " ".join(str(error).split())[:200] or type(error).__name__
  return (
    f"JAX cannot start the platform{'s' if ',' in asked else ''} "
    f"{asked or 'it chose'} ({detail}): install its JAX plugin (the README's "
    f'`pip install "jax[cuda13]"`, `jax[tpu]` lines), or unset JAX_PLATFORMS to run on '
    "this machine's devices"
  )


# -- Flags. --------------------------------------------------------------------


def define_config_flag(
  name: str = "config",
  default: Optional[str] = None,
  help_string: str = "Experiment config file.",
  *,
  required: bool = False,
  flag_values: Optional[flags.FlagValues] = None,
  sys_argv: Optional[list[str]] = None,
) -> flags.FlagHolder:
  """--config=FILE with --config.a.b=value overrides (ml_collections), whose
  default file is loaded only while `parse_flags` runs (a mistyped override
  of the default config is then one line, not a traceback at import), and
  a relative default is a file of the shipped configs' folder (CONFIG_DIR:
  the entry points work from any directory). A --config given on the
  command line is relative to the current directory, as usual.
  `flag_values` and `sys_argv` (default absl's FLAGS and sys.argv) are for
  tests that parse a command line of their own.

  Every override follows one rule, the last value given wins (for tuples
  too: ml_collections' own tuple flags accumulate), and a data source named
  `--config.data.source=module:Name` has its section for its own fields'
  overrides (cli_overrides.install_override_rules, cli_config.config_file_parser)."""
  from ml_collections import config_flags

  if default is not None:
    cli_config.DEFAULT_CONFIGS[name] = (
      default if os.path.isabs(default) else os.path.join(cli_config.CONFIG_DIR, default)
    )
  flag_values = flags.FLAGS if flag_values is None else flag_values
  install_override_rules()
  holder = config_flags.DEFINE_config_file(
    name, None, help_string, flag_values=flag_values, lock_config=True, sys_argv=sys_argv
  )
  flag_values[name].parser = cli_config.config_file_parser(
    type(flag_values[name].parser), name, sys_argv
  )
  if default is not None:
    flag_values[name].default_as_str = repr(default)  # for --help
  if required:
    flags.mark_flag_as_required(name, flag_values=flag_values)
  return holder


def run(main: Callable[[list[str]], Any], doc: Optional[str]) -> None:
  """Runs a tool: absl's app.run(main) with parse_flags. A tool is a module
  of this package (compressive/train.py, ...), started as `python -m
  compressive.train` or through the script of the same name at the
  repository root, which runs the module as __main__ (runpy): either way its
  flags belong to the command's script, as absl names it, and its --help
  starts with `doc`, the tool's docstring (absl prints __main__'s)."""
  sys.modules["__main__"].__doc__ = doc
  app.run(
    _quiet_on_a_closed_pipe(stopping_on_signals(_on_cloud_storage(main), fail)),
    flags_parser=parse_flags,
  )


def _on_cloud_storage(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """main, for a tool that may work on Cloud Storage: each opens its own
  gs:// --workdir (layout.opened) and --output (remote.Upload), whose
  messages name the URLs. The storage clients' INFO lines are quiet where
  a flag names a URL; once Cloud Storage has stopped answering
  (storage.stalled), the tool ends at once with its status, without
  waiting at exit for the threads still waiting on it."""

  def run_main(argv: list[str]) -> Any:
    if any(
      name in flags.FLAGS and remote.is_remote(flags.FLAGS[name].value)
      for name in ("workdir", "output")
    ):
      quiet_libraries()  # the storage clients' INFO lines while a mirror is made
    try:
      return main(argv)
    except SystemExit as e:
      if storage.stalled():
        storage.exit_now(e.code)
      raise

  return run_main


def _quiet_on_a_closed_pipe(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """main, ending quietly (exit 0) when whatever reads its output has gone
  (`| head`, or a runner killed while its child trains: the child saved and
  stopped, and only its last lines had nowhere to go): stdout and stderr
  are pointed at /dev/null so that nothing, not the interpreter's own
  flush at exit, raises BrokenPipeError again."""

  def guarded(argv: list[str]) -> Any:
    try:
      return main(argv)
    except BrokenPipeError:
      devnull = os.open(os.devnull, os.O_WRONLY)
      for stream in (sys.stdout, sys.stderr):
        try:
          os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
          pass
      sys.exit(0)

  return guarded


def tool_help() -> str:
  """--help: the tool's docstring, its own flags (absl's, with --config and
  --compilation_cache among them), the shipped config names and where their
  fields are; printed on stdout, exit 0 (absl's own --help exits 1)."""
  doc = (sys.modules["__main__"].__doc__ or "").strip()
  parts = [doc, flags.FLAGS.main_module_help().strip() or "(no flags)"]
  if cli_config.config_file_flags():
    parts.append(
      textwrap.fill(
        f"Shipped configs (--config=NAME, or --config=path/to/file.py): "
        f"{', '.join(cli_config.config_names())}; a hardware preset takes the "
        "experiment after ':' (--config=gpu8:enwik8). Any field is --config.FIELD=VALUE; "
        "--print_config shows them all (train). --helpfull lists every flag.",
        80,
      )
    )
  return "\n\n".join(parts)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every mistake reported in one line: an unknown
  or malformed flag, a missing or broken --config file, and a bad --config
  override (ml_collections raises plain exceptions for an unknown field or a
  wrong type, which would otherwise print a traceback)."""
  # Every entry point's, and a --config a tool's own: in each one's --help.
  for name in ("compilation_cache", "storage_deadline", *cli_config.config_file_flags()):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  if any(a in ("-h", "-?", "--help", "--helpshort") for a in argv[1:]):
    print(tool_help())
    sys.exit(0)
  xla = os.environ.get("XLA_FLAGS", "")
  repeated = (
    cli_config.repeated_config(argv)
    or cli_xla.xla_flags_problem(xla)
    or cli_xla.xla_flags_unknown(xla)
  )
  if repeated is not None:
    fail(repeated)
  argv = cli_config.resolve_config_names(cli_config.with_default_configs(argv))
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:
    line = cli_parse_errors.parse_failure(argv, e)
    if line is None:
      raise  # not the command line's nor a config file's: a bug
    fail(line)
  unloaded = cli_parse_errors.unloaded_config(argv)
  if unloaded is not None:
    fail(unloaded)
  if len(rest) > 1:  # no entry point takes positional arguments
    fail(f"unexpected arguments: {' '.join(rest[1:])} (flags are --name=value)")
  use_compilation_cache(
    flags.FLAGS.compilation_cache if flags.FLAGS["compilation_cache"].present else None
  )
  return rest


# -- JAX's persistent compilation cache. ----------------------------------------

COMPILATION_CACHE_ENV = "COMPRESSIVE_COMPILATION_CACHE"
JAX_COMPILATION_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"

flags.DEFINE_string(
  "compilation_cache",
  None,
  "Folder of JAX's persistent compilation cache: a run loads the programs an "
  "earlier run compiled (the same model on the same devices) instead of "
  "compiling them again; '' turns it off. Default: JAX's own $"
  + JAX_COMPILATION_CACHE_ENV
  + " if set, else $"
  + COMPILATION_CACHE_ENV
  + " if set, else ~/.cache/compressive/jax.",
)


flags.DEFINE_float(
  "storage_deadline",
  storage.DEFAULT_DEADLINE_S,
  "Seconds a call to Cloud Storage may go unanswered (copying a gs:// workdir's files, "
  "saving a checkpoint there, or waiting for a save) before the tool stops with one line; "
  "0: no deadline.",
)
flags.register_validator(
  "storage_deadline",
  lambda v: v is not None and math.isfinite(v) and v >= 0,
  "--storage_deadline must be a finite number of seconds >= 0 (0: no deadline)",
)


def default_compilation_cache() -> str:
  return os.path.join(os.path.expanduser("~"), ".cache", "compressive", "jax")


def compilation_cache_dir(
  flag: Optional[str], environ: Optional[Mapping[str, str]] = None
) -> Optional[str]:
  """Where JAX's persistent compilation cache goes: `flag` (--compilation_cache
  as given on the command line, None if not given), else None if JAX's own
  $JAX_COMPILATION_CACHE_DIR is set (JAX's setting is then left as it is),
  else $COMPRESSIVE_COMPILATION_CACHE, else ~/.cache/compressive/jax; ''
  for no cache."""
  environ = os.environ if environ is None else environ
  if flag is not None:
    return flag
  if JAX_COMPILATION_CACHE_ENV in environ:
    return None
  if COMPILATION_CACHE_ENV in environ:
    return environ[COMPILATION_CACHE_ENV]
  return default_compilation_cache()


def use_compilation_cache(flag: Optional[str]) -> Optional[str]:
  """Points JAX's persistent compilation cache at compilation_cache_dir(flag)
  (before anything is compiled); returns the folder, '' when off, None when
  JAX's own setting is kept. A folder that cannot be created or written is
  a warning, and the run compiles without it.

  What is cached is JAX's choice: programs that took at least
  jax_persistent_cache_min_compile_time_secs (1 s by default; the train and
  eval steps) to compile, of any size; JAX's own JAX_PERSISTENT_CACHE_*
  variables still set them. The folder may be deleted at any time."""
  import jax

  path = compilation_cache_dir(flag)
  if path is None:
    return None
  if files.is_url(path):  # os.path would make a local folder `gs:` of gs://b/x
    where = "--compilation_cache" if flag is not None else f"${COMPILATION_CACHE_ENV}"
    fail(
      f"{where}={path}: JAX's compilation cache is a folder on this machine, not a URL; "
      "give a local folder, or none with --compilation_cache="
    )
  if path:
    path = os.path.abspath(os.path.expanduser(path))
    try:
      os.makedirs(path, exist_ok=True)
      if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    except OSError as e:
      warn(
        f"compiling without the compilation cache: "
        f"{cli_os_errors.describe_os_error(e) or f'cannot use {path}: {e}'}; choose another folder "
        f"with --compilation_cache=DIR, or none with --compilation_cache="
      )
      path = ""
  if not path:
    jax.config.update("jax_enable_compilation_cache", False)
    return ""
  jax.config.update("jax_compilation_cache_dir", path)
  return path
