"""Data: corpora -> documents -> batches of segments, all numpy on the host.

    data_config = experiment.data  # a DataConfig, as config.check builds it
    tok = data.get_tokenizer(data_config)
    data.check_documents(data_config, 'train', tok)  # optional: every document now
    docs = data.get_documents(data_config, 'train', tok)
    it = data.SegmentIterator(docs, batch_size=B, segment_length=T, seed=0)
    batch = next(it)  # inputs, targets [b, T] int32; mask [b, T] bool;
                      # start_of_sequence [b] bool

The fields a data function reads are `Experiment.data`, a DataConfig
(config.py): the fields every source shares (source, tokenizer, the
SentencePiece fields, cache_tokens) and each source's section
(`data_config.<source>`), an instance of the source's schema (its `Config`,
in its module). Each field is declared there once, with its default and
the comment that says what it means; docs/DATA.md lists every field with
its default (held to the dataclasses by a test).

A new source is one module that calls `registry.register(...)` once and is
imported below.

Nothing here reads flags or environment variables. TensorFlow / TFDS are
imported only by the pg19 source.
"""

# Each source registers itself when imported; the order is that of the
# choices listed in error messages, so isort leaves it as written.
# isort: off
from compressive.data import books  # noqa: F401
from compressive.data import enwik8  # noqa: F401
from compressive.data import pg19  # noqa: F401
from compressive.data import text_files  # noqa: F401
from compressive.data import records  # noqa: F401
from compressive.data import hf_datasets  # noqa: F401
from compressive.data import synthetic  # noqa: F401
from compressive.data import recall  # noqa: F401

# isort: on
from compressive.data import registry
from compressive.data.config import (
  DataConfig,
  check_unread_sections,
  default_data_config,
  validate_data_config,
)
from compressive.data.documents import (
  ByteStreamDocuments,
  Documents,
  TextDocuments,
  TokenDocuments,
  split_by_hash,
)
from compressive.data.iterator import SegmentIterator, epoch_permutation
from compressive.data.registry import SPLITS
from compressive.data.sources import (
  check_documents,
  corpus_identity,
  data_identity,
  describe,
  get_documents,
  iter_texts,
)
from compressive.data.tokenizers import (
  ByteTokenizer,
  SentencePieceTokenizer,
  Tokenizer,
  get_tokenizer,
  train_sentencepiece,
)

__all__ = [
  "SPLITS",
  "ByteStreamDocuments",
  "ByteTokenizer",
  "DataConfig",
  "Documents",
  "SegmentIterator",
  "SentencePieceTokenizer",
  "TextDocuments",
  "TokenDocuments",
  "Tokenizer",
  "check_documents",
  "check_unread_sections",
  "corpus_identity",
  "data_identity",
  "describe",
  "default_data_config",
  "epoch_permutation",
  "get_documents",
  "get_tokenizer",
  "iter_texts",
  "registry",
  "split_by_hash",
  "train_sentencepiece",
  "validate_data_config",
]
