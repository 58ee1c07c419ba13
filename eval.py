"""Evaluate a training workdir: python eval.py --workdir=DIR [--split=test].

Streams whole documents of the split through the model with the evaluation
memory sizes of the workdir's config (override them with the flags below).
Prints the result as one JSON object on the last line of stdout and writes it
to DIR/eval_<split>_step<N>.json. Checkpoints are only read, never written.
"""

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging as absl_logging

from compressive import ConfigError
from compressive import checkpoint
from compressive import data as data_lib
from compressive import eval_lib
from compressive import train_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A training workdir.")
flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.")
flags.DEFINE_enum("split", "test", ["train", "validation", "test"], "Split to evaluate.")
flags.DEFINE_integer("batch_size", None, "Rows streamed in parallel (eval.batch_size).")
flags.DEFINE_integer("segment_length", None, "Tokens per segment (eval.segment_length).")
flags.DEFINE_integer("memory_length", None, "Memory slots (eval.memory_length).")
flags.DEFINE_integer("compressed_memory_length", None,
                     "Compressed memory slots (eval.compressed_memory_length).")
flags.DEFINE_integer("max_segments", None, "Stop after this many segments per row (a quick estimate).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax is chatty at INFO
  try:
    config = checkpoint.load_config(FLAGS.workdir)
    for name in ("batch_size", "segment_length", "memory_length", "compressed_memory_length"):
      if FLAGS[name].value is not None:
        config.eval[name] = FLAGS[name].value
    config.eval.split = FLAGS.split
    train_lib.validate_config(config)
  except (ConfigError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  try:
    config, model = train_lib.load(FLAGS.workdir, FLAGS.step, config=config)
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  tokenizer = data_lib.get_tokenizer(config.data)
  documents = data_lib.get_documents(config.data, FLAGS.split, tokenizer)
  result = eval_lib.evaluate(model, documents, config, max_segments=FLAGS.max_segments)
  step = FLAGS.step if FLAGS.step is not None else checkpoint.Checkpointer(
      FLAGS.workdir, create=False).latest_step()
  result = {"split": FLAGS.split, "step": step, **eval_lib.eval_sizes(config), **result}
  with open(os.path.join(FLAGS.workdir, f"eval_{FLAGS.split}_step{step}.json"), "w") as f:
    json.dump(result, f, indent=2)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
