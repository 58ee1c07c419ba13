"""The flags several entry points share, each defined once here
(define_*_flags), with the checks of their own values: each group registers
its flags' ranges as absl validators (validate_int_flag,
validate_number_flag), run as the command line is parsed, so that a value
out of range is one line `error: --name=VALUE ...` and exit code 2
(cli.parse_flags) before a tool starts, and no tool checks them again.

A base-layer module: the tools import it themselves
(`cli_flags.define_workdir_flags`, `cli_flags.validate_int_flag`, ...).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from absl import flags

from compressive import files, values
from compressive.errors import ConfigError

# The flags several entry points share, each defined once here. They belong to
# the entry point that asks for them (absl's module_name), so that its --help
# lists them as before.


def _caller() -> str:
  """The module calling a define_*_flags below, as absl names it (the
  script's path for __main__)."""
  name = sys._getframe(2).f_globals["__name__"]
  return sys.argv[0] if name == "__main__" else name


def define_workdir_flags(
  help_string: str = "A training workdir.", *, step: bool = True, required: bool = True
) -> None:
  """--workdir (required, unless the tool checks that itself: `required`)
  and, with `step` (the tools that read a run), --step (the checkpoint to
  read: >= 0, checked as it is parsed) and --plugin (the modules a saved
  config may name: reading.opened imports them)."""
  module = _caller()
  flags.DEFINE_string("workdir", None, help_string, module_name=module)
  if step:
    flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.", module_name=module)
    validate_int_flag("step", "[0, 2**31)", must=">= 0, below 2**31")
    flags.DEFINE_multi_string(
      "plugin",
      [],
      "A module to import before the run is read, whose compression or data "
      "source the saved config names as module:Name (a saved config never imports code "
      "itself); repeat for several.",
      module_name=module,
    )
  if required:
    flags.mark_flag_as_required("workdir")
  validate_path_flag("workdir", "a workdir", remote_ok=True)


def validate_path_flag(name: str, what: str, *, remote_ok: bool = False) -> None:
  """Makes files.check_local the string flag's own check (`what` it names:
  a workdir, an export, a prompt file; `remote_ok`: a gs:// URL too), as
  validate_int_flag does."""

  def check(value: Any) -> None:
    if value is not None:
      try:
        files.check_local(value, what, remote_ok=remote_ok)
      except ConfigError as e:
        raise ConfigError(f"--{name}={e}") from None

  _register(name, check)


# (train.py's help, the other tools' help) of each multi-host flag.
_MULTIHOST_HELP = {
  "multihost": (
    "Join JAX's distributed runtime, detecting the cluster (Cloud TPU slice, "
    "SLURM, Open MPI); run the same command on every host.",
    "Join JAX's distributed runtime, detecting the cluster (as train.py).",
  ),
  "coordinator_address": (
    "HOST:PORT of process 0, for clusters JAX does not detect (or "
    "localhost); with --num_processes and --process_id.",
    "HOST:PORT of process 0 (as train.py).",
  ),
  "num_processes": (
    "Processes in the run (with --coordinator_address).",
    "Processes in the run (as train.py).",
  ),
  "process_id": (
    "This process, 0 .. num_processes - 1 (with --coordinator_address).",
    "This process (as train.py).",
  ),
  "join_timeout": (
    "Seconds the processes wait for every one of them to join the run (and "
    "a stopping one for the others to leave) before each ends with one line.",
    "Seconds the processes wait for each other (as train.py).",
  ),
}


def define_multihost_flags(*, refer_to_train: bool = False) -> None:
  """--multihost, --coordinator_address, --num_processes, --process_id: how
  the processes of a multi-host run find each other (scale/processes.py
  initialize_distributed). train.py's help says how; with `refer_to_train`,
  a tool's help refers to it."""
  module = _caller()
  helps = {name: pair[refer_to_train] for name, pair in _MULTIHOST_HELP.items()}
  flags.DEFINE_bool("multihost", False, helps["multihost"], module_name=module)
  flags.DEFINE_string("coordinator_address", None, helps["coordinator_address"], module_name=module)
  flags.DEFINE_integer("num_processes", None, helps["num_processes"], module_name=module)
  flags.DEFINE_integer("process_id", None, helps["process_id"], module_name=module)
  flags.DEFINE_integer("join_timeout", 120, helps["join_timeout"], module_name=module)
  validate_int_flag("join_timeout", "[1, 86400]", must="seconds in [1, 86400]")


def multihost_arguments() -> Optional[dict[str, Any]]:
  """processes.initialize_distributed's arguments from the multi-host flags
  (define_multihost_flags); None for a tool without them."""
  if "multihost" not in flags.FLAGS:
    return None
  return {
    "auto": flags.FLAGS.multihost,
    "coordinator_address": flags.FLAGS.coordinator_address,
    "num_processes": flags.FLAGS.num_processes,
    "process_id": flags.FLAGS.process_id,
    "timeout_s": flags.FLAGS.join_timeout,
  }


# The memory flags' range: evaluation sizes (-1: the training run's), checked
# here as numbers and by config.check_saved against the memory estimate.
SIZE_FLAG_MUST = ">= 0 (or -1: the training run's), below 2**31"


def define_memory_flags(compressed_help: str = "") -> None:
  """--memory_length, --compressed_memory_length (the evaluation memory
  sizes, overriding the saved config's eval section; their range checked as
  they are parsed, the memory estimate by config.check_saved) and
  --mesh_shape; `compressed_help` ends --compressed_memory_length's help
  (default '.')."""
  module = _caller()
  flags.DEFINE_integer(
    "memory_length", None, "Memory slots (eval.memory_length).", module_name=module
  )
  flags.DEFINE_integer(
    "compressed_memory_length",
    None,
    "Compressed memory slots (eval.compressed_memory_length)" + (compressed_help or "."),
    module_name=module,
  )
  flags.DEFINE_list(
    "mesh_shape",
    None,
    "Devices along each of the config's mesh.axes, e.g. 1,8,1 (-1: the "
    "rest); default the saved config's mesh.shape if it fits this machine, else -1,1,...",
    module_name=module,
  )
  for name in ("memory_length", "compressed_memory_length"):
    validate_int_flag(name, "[0, 2**31)", also=(-1,), must=SIZE_FLAG_MUST)


def define_split_flags(split_help: str, max_segments_help: str) -> None:
  """--split, --max_segments and --progress_seconds (with the tool's own help
  for the first two): what to stream through a model, and how often to say
  how far it is; the numbers' ranges checked as they are parsed."""
  module = _caller()
  # One default split for eval.py and analyze.py: validation. The test split
  # is for the final numbers a run reports, asked for by name (README's `make
  # experiment` runs eval.py --split=test); a default that reads it invites
  # choosing runs by their test score.
  flags.DEFINE_enum(
    "split", "validation", ["train", "validation", "test"], split_help, module_name=module
  )
  flags.DEFINE_integer("max_segments", None, max_segments_help, module_name=module)
  flags.DEFINE_float(
    "progress_seconds",
    10.0,
    "Seconds between progress lines on stderr (0: every segment).",
    module_name=module,
  )
  validate_int_flag("max_segments", "[1, 2**31)", must=">= 1, below 2**31")
  validate_number_flag("progress_seconds", "[0, inf)", dtype="float64", must="a finite number >= 0")


def _flag_value_error(name: str, e: ConfigError, value: Any) -> ConfigError:
  """A values.* error about `name` said of the flag: `--name=VALUE ...`."""
  text = str(e)
  prefix = f"{name}={value!r}"
  rest = text[len(prefix) :] if text.startswith(prefix) else f": {text}"
  return ConfigError(f"--{name}={value}{rest}")


def validate_number_flag(
  name: str, interval: str, *, dtype: str = "float32", must: str = ""
) -> None:
  """The float flag's own check (an absl validator): ConfigError
  `--name=VALUE ...` unless the flag is unset or, as `dtype` holds it
  (float32: what the device computes with; float64 for a value only the
  host uses), a number in `interval` (values.number: no NaN, no overflow to
  inf, no underflow to 0, no rounding onto an open end). Run as the command
  line is parsed, so that a value out of range is one line (`parse_flags`)
  before the tool starts, and whenever the flag is set. Called where the
  flag is defined."""
  _register(name, lambda value: _check_number(name, value, interval, dtype, must))


def validate_int_flag(
  name: str, interval: str, *, also: tuple[int, ...] = (), must: str = ""
) -> None:
  """The integer flag's own check, as validate_number_flag's: unset, one of
  `also` (e.g. -1: the training run's), or in `interval` (values.integer)."""
  _register(name, lambda value: _check_int(name, value, interval, also, must))


def _check_number(name: str, value: Any, interval: str, dtype: str, must: str) -> None:
  if value is None:
    return
  try:
    values.number(name, value, interval, dtype=dtype, must=must)
  except ConfigError as e:
    raise _flag_value_error(name, e, value) from None


def _check_int(name: str, value: Any, interval: str, also: tuple[int, ...], must: str) -> None:
  if value is None or value in also:
    return
  try:
    values.integer(name, value, interval, must=must)
  except ConfigError as e:
    raise _flag_value_error(name, e, value) from None


def _register(name: str, check: Callable[[Any], None]) -> None:
  """`check` (raising ConfigError) as flag `name`'s absl validator; its
  message is the error's line (cli_parse_errors.parse_failure drops absl's
  `flag --name=VALUE: ` before it)."""

  def checker(value: Any) -> bool:
    try:
      check(value)
    except ConfigError as e:
      raise flags.ValidationError(str(e)) from None
    return True

  flags.register_validator(name, checker)
