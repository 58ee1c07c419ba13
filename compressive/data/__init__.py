"""Data: corpora -> documents -> batches of segments, all numpy on the host.

    tok = data.get_tokenizer(config.data)
    data.check_documents(config.data, 'train', tok)  # optional: every document now
    docs = data.get_documents(config.data, 'train', tok)
    it = data.SegmentIterator(docs, batch_size=B, segment_length=T, seed=0)
    batch = next(it)  # inputs, targets [b, T] int32; mask [b, T] bool;
                      # start_of_sequence [b] bool

Config fields read (`config.data`, defaults in `default_data_config()`).
Shared by every source:

  source               which corpus: a registered source (registry.py);
                       'books' (default) | 'enwik8' | 'pg19' | 'text_files'
                       | 'synthetic' | 'recall'.
  tokenizer            'bytes' (default; vocabulary 256) | 'sentencepiece'.
  spm_model            path of the SentencePiece .model (tokenizer
                       'sentencepiece'); written by train_tokenizer.py.
  spm_vocab_size, spm_model_type, spm_character_coverage,
  spm_train_max_bytes, spm_train_seed
                       SentencePiece training (train_tokenizer.py): at most
                       this vocabulary, on at most this many bytes of the
                       train split sampled in seeded document order.
  cache_tokens         tokenized documents kept in memory, in tokens.

Each source's own, in its section `config.data.<source>` (documented in
the source's module):

  books.cache_dir      where the archives are cached; '' (default) means
                       ~/.cache/compressive (<cache_dir>/books/).
  books.heldout_fraction, text_files.heldout_fraction
                       split by hash: share of documents (at least one) for
                       each of validation and test (0.05).
  text_files.path      the folder of *.txt files, or one text file, cut into
                       documents of at most text_files.document_bytes
                       (16384) bytes at line ends.
  text_files.text_errors
                       'strict' (default; invalid UTF-8 is an error naming
                       the file) | 'replace' (U+FFFD).
  enwik8.path          the file `enwik8` or `enwik8.zip`.
  enwik8.split_bytes   (train, validation, test) sizes in bytes;
                       (90_000_000, 5_000_000, 5_000_000).
  enwik8.train_shards  contiguous documents the train stream is cut into
                       (128); must be >= the batch size.
  enwik8.eval_shards   the same for validation / test (1: one stream).
  pg19.data_dir        TFDS data_dir of the prepared dataset.
  pg19.raw_dir         local raw files laid out like the bucket
                       gs://deepmind-gutenberg ('' = the bucket itself).
  synthetic.kind       'random' | 'copy' (a repeated random block).
  synthetic.num_docs   documents per split (train, validation, test).
  synthetic.min_length, synthetic.max_length   document lengths in tokens.
  synthetic.period     block length of kind 'copy'.
  synthetic.seed       seeds the synthetic documents.
  recall.distances, recall.doc_length, recall.facts, recall.num_docs,
  recall.seed          the recall task (recall.py).

A new source is one module that calls `registry.register(...)` once and is
imported below.

Nothing here reads flags or environment variables. TensorFlow / TFDS are
imported only by the pg19 source.
"""

# Each source registers itself when imported; the order is that of the
# choices listed in error messages.
from compressive.data import books  # noqa: F401
from compressive.data import enwik8  # noqa: F401
from compressive.data import pg19  # noqa: F401
from compressive.data import text_files  # noqa: F401
from compressive.data import synthetic  # noqa: F401
from compressive.data import recall  # noqa: F401
from compressive.data import registry
from compressive.data.config import default_data_config
from compressive.data.config import validate_data_config
from compressive.data.documents import ByteStreamDocuments
from compressive.data.documents import Documents
from compressive.data.documents import split_by_hash
from compressive.data.documents import TextDocuments
from compressive.data.documents import TokenDocuments
from compressive.data.iterator import epoch_permutation
from compressive.data.iterator import SegmentIterator
from compressive.data.registry import SPLITS
from compressive.data.sources import check_documents
from compressive.data.sources import corpus_identity
from compressive.data.sources import data_identity
from compressive.data.sources import get_documents
from compressive.data.sources import iter_texts
from compressive.data.tokenizers import ByteTokenizer
from compressive.data.tokenizers import get_tokenizer
from compressive.data.tokenizers import SentencePieceTokenizer
from compressive.data.tokenizers import Tokenizer
from compressive.data.tokenizers import train_sentencepiece

__all__ = [
    'SPLITS',
    'ByteStreamDocuments',
    'ByteTokenizer',
    'Documents',
    'SegmentIterator',
    'SentencePieceTokenizer',
    'TextDocuments',
    'TokenDocuments',
    'Tokenizer',
    'check_documents',
    'corpus_identity',
    'data_identity',
    'default_data_config',
    'epoch_permutation',
    'get_documents',
    'get_tokenizer',
    'iter_texts',
    'registry',
    'split_by_hash',
    'train_sentencepiece',
    'validate_data_config',
]
