"""Export a workdir's parameters:

    python -m compressive.export --workdir=DIR --output=OUT [--step=N]

Writes the parameters of the workdir's latest (or --step) checkpoint and its
config into OUT, a new or empty folder: no optimizer state, no training
memory, no data position, so the export is about a third of a checkpoint.
`compressive.load(OUT)` and `sample.py --workdir=OUT` read it like the
workdir. The checkpoint is verified as it is read; the export is written
beside OUT and renamed into place when complete. Single process.
"""

import json
import os

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
  with reading.tool():
    # Cheap checks first: a mistaken --output is found before any restore.
    exporting.check_output(FLAGS.output, FLAGS.workdir, label=f"--output={FLAGS.output}")
    step = exporting.export(FLAGS.workdir, FLAGS.output, FLAGS.step)
  size = sum(
    os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(FLAGS.output) for f in files
  )
  print(
    json.dumps(
      {
        "workdir": remote.public(FLAGS.workdir),
        "step": step,
        "output": remote.public(FLAGS.output),
        "bytes": size,
      }
    ),
    flush=True,
  )


if __name__ == "__main__":
  cli.run(main, __doc__)
