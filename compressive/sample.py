"""Generate text from a trained workdir, streaming it as it is produced.

    python -m compressive.sample --workdir=runs/default --prompt="To be, or not" --num_tokens=500

The prompt is consumed segment by segment into the memory; decoding is token by
token with cached keys and values; length is unbounded, memory use is not.

Only the tokenizer's pieces are sampled: a model whose vocabulary is larger
(model.vocab_size above a SentencePiece model's pieces) never emits an id
its tokenizer cannot decode.

The memory has the evaluation sizes of the workdir's config (config.eval, as
eval.py and analyze.py use; -1 there: training's), which --memory_length and
--compressed_memory_length override; --mesh_shape works as in eval.py.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable, Optional

from absl import flags

from compressive import cli, cli_flags, files, reading
from compressive import data as data_lib
from compressive.errors import ConfigError
from compressive.model.sampling import TextStream

FLAGS = flags.FLAGS

# The most of a --prompt_file read: a prompt is text that the model reads
# once, at any length, into a memory of fixed size.
PROMPT_BYTES = 64 << 20


def define_flags() -> None:
  """sample.py's flags, defined by the tool alone (`python -m
  compressive.sample`): importing the module for `run` defines none."""
  cli_flags.define_workdir_flags()
  flags.DEFINE_string("prompt", None, "Prompt text.")
  flags.DEFINE_string("prompt_file", None, "Read the prompt from this file instead.")
  cli_flags.validate_path_flag("prompt_file", "a prompt file")
  flags.DEFINE_integer("num_tokens", 200, "Tokens to generate.")
  cli_flags.validate_int_flag("num_tokens", "[1, 2**31)", must=">= 1, below 2**31")
  flags.DEFINE_float("temperature", 1.0, "0 means greedy.")
  cli_flags.validate_number_flag("temperature", "[0, inf)", must="a finite number >= 0 (0: greedy)")
  flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0: all).")
  cli_flags.validate_int_flag("top_k", "[0, 2**31)", must=">= 0 (0: all tokens), below 2**31")
  flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1: off).")
  cli_flags.validate_number_flag("top_p", "(0, 1]", must="in (0, 1] (1: off)")
  flags.DEFINE_integer("seed", 0, "Sampling seed.")
  cli_flags.validate_int_flag(
    "seed", "[0, 2**32)", must="an integer in [0, 2**32) (the PRNG key's 32 bits)"
  )
  cli_flags.define_memory_flags()


@dataclasses.dataclass(frozen=True)
class Args:
  """What sample.py is given, as `run` takes it: its flags, parsed."""

  reading: reading.Reading  # the run, its step, memory sizes and mesh
  prompt: str  # the text to continue (read from --prompt or --prompt_file)
  num_tokens: int = 200
  temperature: float = 1.0  # 0: greedy
  top_k: int = 0  # 0: all tokens
  top_p: float = 1.0  # 1: off
  seed: int = 0

  @classmethod
  def from_flags(cls) -> Args:
    """The Args of this process's command line (absl's FLAGS, parsed; the
    prompt read, ConfigError when it cannot be)."""
    return cls(
      reading=reading.Reading.from_flags(),
      prompt=read_prompt(),
      num_tokens=FLAGS.num_tokens,
      temperature=FLAGS.temperature,
      top_k=FLAGS.top_k,
      top_p=FLAGS.top_p,
      seed=FLAGS.seed,
    )


def validate_flags() -> None:
  """What the flags' own checks (their ranges, as they are parsed) cannot
  see: which prompt flag is given."""
  if (FLAGS.prompt is None) == (FLAGS.prompt_file is None):
    raise ConfigError("give exactly one of --prompt or --prompt_file")


def read_prompt() -> str:
  """The prompt text (UTF-8), from --prompt or --prompt_file; never empty."""
  if FLAGS.prompt_file is not None:
    name = FLAGS.prompt_file
    if not os.path.exists(name):
      raise ConfigError(f"--prompt_file={name}: no such file")
    try:
      raw = files.read_bytes(name, PROMPT_BYTES, follow=True)
    except files.NotAFileError as e:  # a folder, a FIFO, /dev/zero, a file past the bound
      raise ConfigError(f"--prompt_file={name} is {e.what}") from None
    try:
      prompt = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
      raise ConfigError(
        f"--prompt_file={name} is not UTF-8 text: invalid byte at offset {e.start} ({e.reason})"
      ) from None
    flag = f"--prompt_file={name}"
  else:
    prompt, flag = FLAGS.prompt, "--prompt"
    try:
      prompt.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes on the command line
      raise ConfigError("--prompt is not valid UTF-8 text") from None
  if not prompt:
    raise ConfigError(f"the prompt is empty ({flag}): give at least one character")
  return prompt


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments

  def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()

  with reading.command(validate_flags):
    args = Args.from_flags()
    try:
      run(args, write)
    except BrokenPipeError:  # the reader stopped early (`| head`): not an error
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run(args: Args, write: Optional[Callable[[str], None]] = None) -> str:
  """Samples as sample.py's command line `args` says (each mistake a
  UserError naming it): the prompt and its continuation, each piece of
  text handed to `write` as it is made (the prompt first; a character cut
  short by the end as U+FFFD)."""
  write = write or (lambda text: None)
  with reading.opened(args.reading) as place:
    experiment = reading.experiment_of(place, args.reading)  # before any model is built
    tokenizer = data_lib.get_tokenizer(experiment.data)
    ids = tokenizer.encode(args.prompt)
    if ids.size == 0:
      raise ConfigError("the prompt is empty after tokenization: give at least one token")
    model = reading.open_run(place, args.reading, experiment).model
  sizes = experiment.eval
  sampler = reading.PiecesSampler(
    model,
    pieces=tokenizer.vocab_size,
    batch_size=1,
    memory_length=sizes.memory_length,
    compressed_memory_length=sizes.compressed_memory_length,
  )
  stream = TextStream(tokenizer)
  pieces = [args.prompt]
  write(args.prompt)
  for token in sampler.generate(
    ids,
    args.num_tokens,
    temperature=args.temperature,
    top_k=args.top_k,
    top_p=args.top_p,
    seed=args.seed,
  ):
    pieces.append(stream.push(int(token[0])))
    write(pieces[-1])
  pieces.append(stream.flush() + "\n")
  write(pieces[-1])
  return "".join(pieces)


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__)
