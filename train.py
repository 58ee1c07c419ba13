"""Train a Compressive Transformer: python train.py --config=configs/X.py --workdir=DIR.

Override any config field with --config.a.b=value (a typo is an error). A
workdir that already holds checkpoints is resumed from its latest one.
"""

import logging
import sys

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from compressive import ConfigError
from compressive import train_lib

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", "configs/default.py", "Experiment config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and TensorBoard logs go here.")
flags.mark_flags_as_required(["workdir"])


def setup_logging() -> None:
  absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax is chatty at INFO
  logging.getLogger("compressive").setLevel(logging.INFO)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  setup_logging()
  try:
    train_lib.validate_config(FLAGS.config)
    result = train_lib.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"TensorBoard logs: tensorboard --logdir {FLAGS.workdir}/tensorboard")
  if result:
    print("final evaluation:", " ".join(f"{k}={v:.4f}" for k, v in result.items()))


if __name__ == "__main__":
  app.run(main)
