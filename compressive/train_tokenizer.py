"""Trains the SentencePiece tokenizer of an experiment on its train split.

    python -m compressive.train_tokenizer --config=pg19 --config.data.spm_model=PATH

Reads at most config.data.spm_train_max_bytes of the training split of
config.data.source (documents in seeded random order) and writes the model
to config.data.spm_model, with config.data.spm_vocab_size pieces at most
(the paper: 32k subwords for PG-19): a small corpus gives fewer. The last
line of stdout names the file, its pieces and the flags that train a model
on it (--config.model.vocab_size=PIECES). A mistake (a config field, the
corpus, an output path that cannot be written, a vocabulary too small for
the corpus) is one line `error: ...` and exit code 2, as in train.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

from absl import flags

from compressive import cli, cli_config, data, files
from compressive.errors import ConfigError

FLAGS = flags.FLAGS


def define_flags() -> None:
  """train_tokenizer.py's flags, defined by the tool alone (`python -m
  compressive.train_tokenizer`): importing the module for `run` defines none."""
  cli.define_config_flag(required=True)


@dataclasses.dataclass(frozen=True)
class Args:
  """What train_tokenizer.py is given, as `run` takes it: its flags, parsed."""

  config: Any  # --config, its overrides applied (what the config file returns)
  overridden: frozenset[str] = frozenset()  # the fields --config.X overrides, dotted

  @classmethod
  def from_flags(cls) -> Args:
    """The Args of this process's command line (absl's FLAGS, parsed)."""
    return cls(config=FLAGS.config, overridden=frozenset(cli_config.overridden_fields(sys.argv)))


def validate(data_config: data.DataConfig) -> None:
  """The fields this step reads (their ranges DataConfig checked as it was
  made), and the output path, before any reading."""
  data.validate_data_config(data_config, need_tokenizer_model=False)
  if not data_config.spm_model:
    raise ConfigError("data.spm_model (the output path) is empty")
  files.check_local(data_config.spm_model, "data.spm_model (the .model file to write)")
  if os.path.isdir(data_config.spm_model):
    raise ConfigError(
      f"data.spm_model={data_config.spm_model!r} is a folder: give the path of "
      "the .model file to write"
    )
  # The output folder now, not after training: an unwritable one is an error
  # that names it (cli.user_errors).
  os.makedirs(os.path.dirname(os.path.abspath(data_config.spm_model)), exist_ok=True)


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  cli.quiet_libraries()
  logging.getLogger("compressive").setLevel(logging.INFO)  # a download's progress
  with cli.user_errors():
    data_config, pieces = run(Args.from_flags())
  fewer = (
    f" (fewer than data.spm_vocab_size={data_config.spm_vocab_size}: the corpus has no more)"
    if pieces < data_config.spm_vocab_size
    else ""
  )
  print(
    f"wrote {data_config.spm_model}: {pieces} pieces{fewer}; train with "
    f"--config.data.tokenizer=sentencepiece --config.data.spm_model={data_config.spm_model} "
    f"--config.model.vocab_size={pieces}",
    flush=True,
  )


def run(args: Args) -> tuple[data.DataConfig, int]:
  """Trains the SentencePiece model of `args.config`'s data section (each
  mistake a UserError naming it): (that data section, the model's pieces),
  the model written at data.spm_model."""
  if "data" not in args.config:
    raise ConfigError("the config has no data section (config.data)")
  data_config = data.DataConfig.from_dict(args.config.data)
  data.check_unread_sections(data_config, args.overridden)
  validate(data_config)
  texts = data.iter_texts(
    data_config,
    "train",
    max_bytes=data_config.spm_train_max_bytes,
    seed=data_config.spm_train_seed,
  )
  tokenizer = data.train_sentencepiece(
    texts,
    vocab_size=data_config.spm_vocab_size,
    model_path=data_config.spm_model,
    model_type=data_config.spm_model_type,
    character_coverage=data_config.spm_character_coverage,
    num_threads=os.cpu_count() or 1,
    seed=data_config.spm_train_seed,
  )
  return data_config, tokenizer.vocab_size


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__)
