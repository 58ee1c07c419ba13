"""Export a workdir's parameters:

    python -m compressive.export --workdir=DIR --output=OUT [--step=N]

Writes the parameters of the workdir's latest (or --step) checkpoint and its
config into OUT, a new or empty folder: no optimizer state, no training
memory, no data position, so the export is about a third of a checkpoint.
`compressive.load(OUT)` and `sample.py --workdir=OUT` read it like the
workdir. The checkpoint is verified as it is read; the export is written
beside OUT and renamed into place when complete. Single process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Iterator, Optional

from absl import flags

from compressive import cli, cli_flags, reading, remote
from compressive.training import exporting

FLAGS = flags.FLAGS


def define_flags() -> None:
  """export.py's flags, defined by the tool alone (`python -m
  compressive.export`): importing the module for `run` defines none."""
  cli_flags.define_workdir_flags()
  flags.DEFINE_string("output", None, "The export's folder: new, or empty.")
  flags.mark_flag_as_required("output")
  cli_flags.validate_path_flag("output", "an export", remote_ok=True)


@dataclasses.dataclass(frozen=True)
class Args:
  """What export.py is given, as `run` takes it: its flags, parsed."""

  reading: reading.Reading  # the workdir and its step
  output: str  # the export's folder (new or empty), or a gs:// URL

  @classmethod
  def from_flags(cls) -> Args:
    """The Args of this process's command line (absl's FLAGS, parsed)."""
    return cls(reading=reading.Reading.from_flags(sizes=()), output=FLAGS.output)


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  with reading.command():
    result = run(Args.from_flags())
  print(json.dumps(result), flush=True)


def run(args: Args) -> dict[str, Any]:
  """Exports as export.py's command line `args` says (each mistake a
  UserError naming it); what was written: the workdir, the step, the
  output and its size in bytes."""
  label = f"--output={args.output}"
  deadline = args.reading.storage_deadline
  with reading.opened(args.reading) as place, _output(args.output, label, deadline) as output:
    # Cheap checks first: a mistaken --output is found before any restore.
    exporting.check_output(output, place, label=label)
    step = exporting.export(place, output, args.reading.step)
    size = sum(
      os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(output) for f in names
    )
  return {"workdir": args.reading.workdir, "step": step, "output": args.output, "bytes": size}


@contextlib.contextmanager
def _output(path: str, label: str, deadline: Optional[float]) -> Iterator[str]:
  """The folder the export is written to: `path`, or for a gs:// URL a
  local folder copied there when the body ends (remote.Upload, its storage
  calls each within `deadline` seconds)."""
  if not remote.is_remote(path):
    yield path
    return
  with remote.Upload(path, label, deadline) as upload:
    yield upload.local


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__)
