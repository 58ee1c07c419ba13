"""Generate text from a trained workdir, streaming it as it is produced.

    python sample.py --workdir=runs/default --prompt="To be, or not" --num_tokens=500

The prompt is consumed segment by segment into the memory; decoding is token by
token with cached keys and values; length is unbounded, memory use is not.
"""

import sys

from absl import app
from absl import flags
from absl import logging as absl_logging

import compressive
from compressive import cli
from compressive import data as data_lib
from compressive.sampling import Sampler, TextStream

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A training workdir.")
flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.")
flags.DEFINE_string("prompt", None, "Prompt text.")
flags.DEFINE_string("prompt_file", None, "Read the prompt from this file instead.")
flags.DEFINE_integer("num_tokens", 200, "Tokens to generate.")
flags.DEFINE_float("temperature", 1.0, "0 means greedy.")
flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0: all).")
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1: off).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax warns that read-only is read-only
  if (FLAGS.prompt is None) == (FLAGS.prompt_file is None):
    print("error: give exactly one of --prompt or --prompt_file", file=sys.stderr)
    sys.exit(2)
  if FLAGS.prompt_file is not None:
    with open(FLAGS.prompt_file, encoding="utf-8") as f:
      prompt = f.read()
  else:
    prompt = FLAGS.prompt
  with cli.user_errors():
    config, model = compressive.load(FLAGS.workdir, FLAGS.step)
  tokenizer = data_lib.get_tokenizer(config.data)
  ids = tokenizer.encode(prompt)
  if ids.size == 0:
    print("error: the prompt is empty", file=sys.stderr)
    sys.exit(2)
  sampler = Sampler(model, batch_size=1)
  stream = TextStream(tokenizer)
  sys.stdout.write(prompt)
  for token in sampler.generate(ids, FLAGS.num_tokens, temperature=FLAGS.temperature,
                                top_k=FLAGS.top_k, top_p=FLAGS.top_p, seed=FLAGS.seed):
    sys.stdout.write(stream.push(int(token[0])))
    sys.stdout.flush()
  sys.stdout.write("\n")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
