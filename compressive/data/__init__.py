"""Data: corpora -> documents -> batches of segments, all numpy on the host.

    tok = data.get_tokenizer(config.data)
    data.check_documents(config.data, 'train', tok)  # optional: every document now
    docs = data.get_documents(config.data, 'train', tok)
    it = data.SegmentIterator(docs, batch_size=B, segment_length=T, seed=0)
    batch = next(it)  # inputs, targets [b, T] int32; mask [b, T] bool;
                      # start_of_sequence [b] bool

Config fields read (`config.data`, defaults in `default_data_config()`):

  source               'books' (default) | 'enwik8' | 'pg19' | 'text_files'
                       | 'synthetic': which corpus.
  tokenizer            'bytes' (default; vocabulary 256) | 'sentencepiece'.
  spm_model            path of the SentencePiece .model (tokenizer
                       'sentencepiece'); written by train_tokenizer.py.
  cache_dir            where fetched corpora are cached; '' (default) means
                       ~/.cache/compressive. books: <cache_dir>/books/.
  path                 enwik8: the file `enwik8` or `enwik8.zip`;
                       text_files: the folder of *.txt files.
  data_dir             pg19: TFDS data_dir of the prepared dataset.
  pg19_raw_dir         pg19: local raw files laid out like the bucket
                       gs://deepmind-gutenberg ('' = the bucket itself).
  heldout_fraction     books / text_files split by hash: share of documents
                       (at least one) for each of validation and test (0.05).
  text_errors          text_files: 'strict' (default; invalid UTF-8 is an
                       error naming the file) | 'replace' (U+FFFD).
  enwik8_split_bytes   (train, validation, test) sizes in bytes;
                       (90_000_000, 5_000_000, 5_000_000).
  enwik8_train_shards  contiguous documents the train stream is cut into
                       (128); must be >= the batch size.
  enwik8_eval_shards   the same for validation / test (1: one stream).
  synthetic_kind       'random' | 'copy' (a repeated random block).
  synthetic_num_docs   documents per split (train, validation, test).
  synthetic_min_length, synthetic_max_length   document lengths in tokens.
  synthetic_period     block length of kind 'copy'.
  synthetic_seed       seeds the synthetic documents.
  spm_vocab_size, spm_model_type, spm_character_coverage,
  spm_train_max_bytes, spm_train_seed
                       SentencePiece training (train_tokenizer.py): at most
                       this vocabulary, on at most this many bytes of the
                       train split sampled in seeded document order.
  cache_tokens         tokenized documents kept in memory, in tokens.

Nothing here reads flags or environment variables. TensorFlow / TFDS are
imported only by the pg19 source.
"""

from compressive.data.config import default_data_config
from compressive.data.config import validate_data_config
from compressive.data.documents import ByteStreamDocuments
from compressive.data.documents import Documents
from compressive.data.documents import split_by_hash
from compressive.data.documents import TextDocuments
from compressive.data.documents import TokenDocuments
from compressive.data.iterator import epoch_permutation
from compressive.data.iterator import SegmentIterator
from compressive.data.sources import check_documents
from compressive.data.sources import get_documents
from compressive.data.sources import iter_texts
from compressive.data.tokenizers import ByteTokenizer
from compressive.data.tokenizers import get_tokenizer
from compressive.data.tokenizers import SentencePieceTokenizer
from compressive.data.tokenizers import Tokenizer
from compressive.data.tokenizers import train_sentencepiece

__all__ = [
    'ByteStreamDocuments',
    'ByteTokenizer',
    'Documents',
    'SegmentIterator',
    'SentencePieceTokenizer',
    'TextDocuments',
    'TokenDocuments',
    'Tokenizer',
    'check_documents',
    'default_data_config',
    'epoch_permutation',
    'get_documents',
    'get_tokenizer',
    'iter_texts',
    'split_by_hash',
    'train_sentencepiece',
]
