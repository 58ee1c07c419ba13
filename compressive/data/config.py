"""The data section of an experiment config: every field and its default.

`default_data_config()` is what the experiment configs hold as `config.data`
(configs/default.py writes it out, as plain data, and
tests/tools/test_configs.py holds the two equal), so that `--config.data.source=enwik8` style overrides are
checked against this list (a typo is an error, not a new key). It holds the
fields every source shares at `config.data.<field>`, and one section per
registered source at `config.data.<source>.<field>` (registry.py), built by
that source; e.g. `--config.data.enwik8.path=/data/enwik8.zip`. The meaning
of each field is documented in `compressive/data/__init__.py` and in the
source's module.
"""

from __future__ import annotations

import os

import ml_collections
import numpy as np

from compressive import values
from compressive.data import registry
from compressive.data import tokenizers

TOKENIZERS = ('bytes', 'sentencepiece')


def default_data_config() -> ml_collections.ConfigDict:
  """Returns the data ConfigDict with all fields at their defaults.

  The defaults describe the small default experiment: a byte-level model on
  the public-domain `books` corpus, fetched once into `~/.cache/compressive`.
  The result is locked: setting a field that does not exist (a typo, or a
  field of the flat layout before per-source sections) is an error rather
  than a new field that nothing reads.
  """
  c = ml_collections.ConfigDict()
  # Which corpus and which tokenizer.
  c.source = 'books'
  c.tokenizer = 'bytes'
  c.spm_model = ''  # Path of a SentencePiece .model (tokenizer=sentencepiece).

  # SentencePiece training (train_tokenizer.py); the paper uses 32k subwords
  # on PG-19. Training reads at most spm_train_max_bytes of the train split.
  c.spm_vocab_size = 32000
  c.spm_model_type = 'unigram'
  c.spm_character_coverage = 0.9999
  c.spm_train_max_bytes = 100_000_000
  c.spm_train_seed = 0

  # Tokenized documents kept in memory (in tokens); least recently used
  # documents are dropped beyond this.
  c.cache_tokens = 1 << 26

  # Each source's own fields, in a section named after it.
  for name in registry.names():
    if name in c:
      raise ValueError(f'data source {name!r} has the name of a shared data field')
    c[name] = registry.get(name).default_config()
  c.lock()
  return c


def _host_memory() -> int:
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def _is_byte_count(value) -> bool:
  return bool(isinstance(value, (int, np.integer)) and not isinstance(value, bool)
              and value >= 0)


def _check_host_bytes(c: ml_collections.ConfigDict, source: registry.Source) -> None:
  """ConfigError when a size of the data config cannot fit this host's
  memory, before anything is generated or read: the source's documents by
  its estimate from its fields (Source.host_bytes), the token cache's
  bound, and the text SentencePiece's training reads."""
  from compressive.errors import ConfigError
  values.integer('data.spm_vocab_size', c.spm_vocab_size, '[1, 2**31)',
                 must='an integer >= 1 (pieces), below 2**31')
  values.integer('data.spm_train_max_bytes', c.spm_train_max_bytes, '[1, 2**63)',
                 must='an integer >= 1 (bytes)')
  have = _host_memory()
  sizes = [(f'the documents of data.{source.name} (by their lengths and counts)',
            registry.call_hook(c.source, source, 'host_bytes', c, returns=(
                _is_byte_count, 'an int >= 0 (bytes)')) if source.host_bytes else 0),
           (f'data.cache_tokens={c.cache_tokens} int32 tokens', 4 * c.cache_tokens),
           (f'data.spm_train_max_bytes={c.spm_train_max_bytes} bytes of text',
            c.spm_train_max_bytes)]
  for what, need in sizes:
    if need > have:
      raise ConfigError(
          f'{what} need at least {need / 2**30:,.1f} GiB, {need / have:,.1f} times the '
          f"{have / 2**30:,.1f} GiB of this host's memory: lower the data config's sizes")


def validate_data_config(c: ml_collections.ConfigDict, *, need_tokenizer_model: bool = True) -> None:
  """Checks names and paths before anything is read; ConfigError naming the field.

  The shared fields, the section of data.source by that source's own
  validator (the other sections are not read, so they are not checked),
  then the SentencePiece model, read once to see that it is one.
  need_tokenizer_model=False skips the model (for the step that trains it).
  """
  import os
  from compressive.errors import ConfigError, DataError

  source = registry.get(c.source)
  if c.tokenizer not in TOKENIZERS:
    raise ConfigError(
        f"data.tokenizer={c.tokenizer!r} is unknown; choose one of {', '.join(TOKENIZERS)}")
  # SentencePiece's fields, used by train_tokenizer.py: its seed is a uint32,
  # the coverage a float32.
  values.number('data.spm_character_coverage', c.spm_character_coverage, '(0, 1]')
  values.integer('data.spm_train_seed', c.spm_train_seed, '[0, 2**32)')
  values.integer('data.cache_tokens', c.cache_tokens, '[0, 2**63)',
                 must='an integer >= 0 (tokens kept in memory)')
  registry.section(c, source.name)
  source.validate(c)
  _check_host_bytes(c, source)
  if c.tokenizer == 'sentencepiece' and need_tokenizer_model:
    if not c.spm_model:
      raise ConfigError(
          "data.spm_model is empty: give the SentencePiece model's path (train one with "
          "train_tokenizer.py)")
    if os.path.isdir(c.spm_model):
      raise ConfigError(f"data.spm_model={c.spm_model!r} is a folder, not a .model file")
    if not os.path.isfile(c.spm_model):
      raise ConfigError(
          f"data.spm_model={c.spm_model!r} does not exist: train it with train_tokenizer.py "
          "or fix the path")
    try:  # a moment's read: a file that is not a model is named now, not mid-run
      tokenizers.SentencePieceTokenizer(c.spm_model)
    except DataError as e:
      raise ConfigError(str(e)) from None

