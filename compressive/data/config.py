"""The data section of an experiment config: every field and its default.

`default_data_config()` is embedded by the experiment configs as
`config.data`, so that `--config.data.source=enwik8` style overrides are
checked against this list (a typo is an error, not a new key). The meaning of
each field is documented in `compressive/data/__init__.py`.
"""

from __future__ import annotations

import ml_collections

SOURCES = ('books', 'enwik8', 'pg19', 'text_files', 'synthetic', 'recall')
TOKENIZERS = ('bytes', 'sentencepiece')


def default_data_config() -> ml_collections.ConfigDict:
  """Returns the data ConfigDict with all fields at their defaults.

  The defaults describe the small default experiment: a byte-level model on
  the public-domain `books` corpus, fetched once into `~/.cache/compressive`.
  """
  c = ml_collections.ConfigDict()
  # Which corpus and which tokenizer.
  c.source = 'books'
  c.tokenizer = 'bytes'
  c.spm_model = ''  # Path of a SentencePiece .model (tokenizer=sentencepiece).

  # Where things live. '' for cache_dir means ~/.cache/compressive.
  c.cache_dir = ''
  c.path = ''  # enwik8: the enwik8 or enwik8.zip file; text_files: a folder.
  c.data_dir = ''  # pg19: the TFDS data_dir holding the prepared dataset.
  c.pg19_raw_dir = ''  # pg19: local copy of the raw bucket; '' = the bucket.

  # books / text_files: held-out share of documents for each of validation
  # and test when the split is made by document hash.
  c.heldout_fraction = 0.05
  # How undecodable UTF-8 in text files is handled: 'strict' raises an error
  # naming the file; 'replace' substitutes U+FFFD (counted in num_bytes as
  # the 3 bytes of U+FFFD, since num_bytes measures the text the model sees).
  c.text_errors = 'strict'

  # enwik8: split sizes in bytes (train, validation, test), which must add up
  # to the file size, and how many contiguous documents each split is cut
  # into. Training rows need at least batch_size documents to stay busy;
  # evaluation on one document is the paper's single-stream evaluation.
  c.enwik8_split_bytes = (90_000_000, 5_000_000, 5_000_000)
  c.enwik8_train_shards = 128
  c.enwik8_eval_shards = 1

  # synthetic: documents drawn from a seeded RNG. kind='random' draws i.i.d.
  # tokens; kind='copy' repeats a random block of synthetic_period tokens, so
  # a model with enough memory can predict everything after the first block.
  c.synthetic_kind = 'random'
  c.synthetic_num_docs = (64, 8, 8)  # (train, validation, test)
  c.synthetic_min_length = 2
  c.synthetic_max_length = 2048
  c.synthetic_period = 64
  c.synthetic_seed = 0

  # recall (compressive/data/recall.py): facts planted in filler text and
  # queried this many bytes later (one distance drawn per fact); documents of
  # recall_doc_length bytes with recall_facts facts each.
  c.recall_distances = (64, 256, 1024)
  c.recall_doc_length = 4096
  c.recall_facts = 8

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
  return c


def validate_data_config(c: ml_collections.ConfigDict, *, need_tokenizer_model: bool = True) -> None:
  """Checks names and paths before anything is read; ConfigError naming the field.

  need_tokenizer_model=False skips the SentencePiece model check (for the
  step that trains it).
  """
  import os  # pylint: disable=g-import-not-at-top
  from compressive.errors import ConfigError  # pylint: disable=g-import-not-at-top

  if c.source not in SOURCES:
    raise ConfigError(f"data.source={c.source!r} is unknown; choose one of {', '.join(SOURCES)}")
  if c.tokenizer not in TOKENIZERS:
    raise ConfigError(
        f"data.tokenizer={c.tokenizer!r} is unknown; choose one of {', '.join(TOKENIZERS)}")
  if c.tokenizer == 'sentencepiece' and need_tokenizer_model:
    if not c.spm_model:
      raise ConfigError(
          "data.spm_model is empty: give the SentencePiece model's path (train one with "
          "train_tokenizer.py)")
    if not os.path.isfile(c.spm_model):
      raise ConfigError(
          f"data.spm_model={c.spm_model!r} does not exist: train it with train_tokenizer.py "
          "or fix the path")
  if c.source == 'enwik8':
    if not c.path:
      raise ConfigError("data.path is empty: give the enwik8 file or enwik8.zip")
    if not os.path.isfile(c.path):
      raise ConfigError(f"data.path={c.path!r} does not exist: give the enwik8 file or enwik8.zip")
  if c.source == 'text_files' and not os.path.isdir(c.path or ''):
    raise ConfigError(f"data.path={c.path!r} is not a directory of .txt files")
  if c.source == 'pg19' and not c.data_dir:
    raise ConfigError("data.data_dir is empty: give the TFDS data_dir for pg19")
  if c.source == 'recall' and c.tokenizer != 'bytes':
    raise ConfigError("data.source='recall' is byte text: set data.tokenizer=bytes")
  if not 0.0 < c.heldout_fraction < 0.5:
    raise ConfigError(f"data.heldout_fraction={c.heldout_fraction} must be in (0, 0.5)")
  if c.text_errors not in ('strict', 'replace'):
    raise ConfigError(f"data.text_errors={c.text_errors!r} must be 'strict' or 'replace'")
