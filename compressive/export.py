"""Export a workdir's parameters:

    python -m compressive.export --workdir=DIR --output=OUT [--step=N]

Writes the parameters of the workdir's latest (or --step) checkpoint and its
config into OUT, a new or empty folder: no optimizer state, no training
memory, no data position, so the export is about a third of a checkpoint.
`compressive.load(OUT)` and `sample.py --workdir=OUT` read it like the
workdir. The checkpoint is verified as it is read; the export is written
beside OUT and renamed into place when complete. Single process.
"""

import contextlib
import json
import os
from typing import Iterator

from absl import flags

from compressive import cli, cli_flags, reading, remote
from compressive.training import exporting

FLAGS = flags.FLAGS
cli_flags.define_workdir_flags()
flags.DEFINE_string("output", None, "The export's folder: new, or empty.")
flags.mark_flag_as_required("output")
cli_flags.validate_path_flag("output", "an export", remote_ok=True)


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  label = f"--output={FLAGS.output}"
  with reading.tool() as place, _output(FLAGS.output, label) as output:
    # Cheap checks first: a mistaken --output is found before any restore.
    exporting.check_output(output, place, label=label)
    step = exporting.export(place, output, FLAGS.step)
    size = sum(
      os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(output) for f in files
    )
  print(
    json.dumps({"workdir": FLAGS.workdir, "step": step, "output": FLAGS.output, "bytes": size}),
    flush=True,
  )


@contextlib.contextmanager
def _output(path: str, label: str) -> Iterator[str]:
  """The folder the export is written to: `path`, or for a gs:// URL a
  local folder copied there when the body ends (remote.Upload)."""
  if not remote.is_remote(path):
    yield path
    return
  with remote.Upload(path, label, FLAGS.storage_deadline or None) as upload:
    yield upload.local


if __name__ == "__main__":
  cli.run(main, __doc__)
