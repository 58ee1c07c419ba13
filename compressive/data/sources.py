"""get_documents: one split of the corpus named by data.source."""

from __future__ import annotations

from typing import Iterator

import ml_collections

from compressive.errors import DataError
from compressive.data import books as books_lib
from compressive.data import documents as documents_lib
from compressive.data import tokenizers

SPLITS = ('train', 'validation', 'test')


def _books_documents(data_config: ml_collections.ConfigDict, split: str,
                     tokenizer: tokenizers.Tokenizer
                     ) -> documents_lib.TextDocuments:
  cache_dir = data_config.cache_dir or books_lib.default_cache_dir()
  books = books_lib.load_books(cache_dir)
  chosen = documents_lib.split_by_hash([b.group for b in books],
                                       data_config.heldout_fraction)[split]
  chosen_books = [books[i] for i in chosen]
  return documents_lib.TextDocuments(
      names=[f'{b.key} ({b.title})' for b in chosen_books],
      load_text=lambda i: chosen_books[i].text,
      tokenizer=tokenizer,
      description=f'books/{split}',
      cache_tokens=data_config.cache_tokens)


def get_documents(data_config: ml_collections.ConfigDict, split: str,
                  tokenizer: tokenizers.Tokenizer) -> documents_lib.Documents:
  """The documents of `split` ('train'|'validation'|'test') of data.source."""
  if split not in SPLITS:
    raise DataError(f'split must be one of {SPLITS}, got {split!r}')
  source = data_config.source
  if source == 'books':
    return _books_documents(data_config, split, tokenizer)
  # Imported on use: enwik8 / text_files / synthetic need no TensorFlow.
  if source == 'enwik8':
    from compressive.data import enwik8  # pylint: disable=g-import-not-at-top
    return enwik8.get_documents(data_config, split, tokenizer)
  if source == 'pg19':
    from compressive.data import pg19  # pylint: disable=g-import-not-at-top
    return pg19.get_documents(data_config, split, tokenizer)
  if source == 'text_files':
    from compressive.data import text_files  # pylint: disable=g-import-not-at-top
    return text_files.get_documents(data_config, split, tokenizer)
  if source == 'synthetic':
    from compressive.data import synthetic  # pylint: disable=g-import-not-at-top
    return synthetic.get_documents(data_config, split, tokenizer)
  if source == 'recall':
    from compressive.data import recall  # pylint: disable=g-import-not-at-top
    return recall.get_documents(data_config, split, tokenizer)
  raise DataError(
      f'Unknown data.source {source!r}; expected one of books, enwik8, pg19, '
      'text_files, synthetic, recall')


def check_documents(data_config: ml_collections.ConfigDict, split: str,
                    tokenizer: tokenizers.Tokenizer) -> None:
  """Finds up front what reading `split` would otherwise find mid-run.

  Raises DataError naming the first bad document, as get_documents and
  Documents.tokens would when a batch row reached it:
  - text_files: every file is read once (streamed, one at a time): it must
    be readable, not empty, UTF-8 (unless data.text_errors='replace'), have
    at least 2 tokens, and a printable UTF-8 name;
  - synthetic, recall, enwik8 (held in memory): every document has at least
    2 tokens;
  - books (pinned archives), pg19 (prepared by TFDS): nothing more than
    get_documents does.
  Costs one read of the split for text_files; a moment for the others.
  """
  if split not in SPLITS:
    raise DataError(f'split must be one of {SPLITS}, got {split!r}')
  source = data_config.source
  if source == 'text_files':
    from compressive.data import text_files  # pylint: disable=g-import-not-at-top
    text_files.check_documents(data_config, split, tokenizer)
  elif source in ('synthetic', 'recall', 'enwik8'):
    docs = get_documents(data_config, split, tokenizer)
    for i in range(len(docs)):
      docs.num_tokens(i)  # DataError naming a document of fewer than 2 tokens


def iter_texts(data_config: ml_collections.ConfigDict, split: str,
               max_bytes: int | None = None, seed: int = 0) -> Iterator[str]:
  """Yields original texts of a split (e.g. to train a tokenizer).

  Documents come in a seeded random order, so that a `max_bytes` budget
  samples the whole split rather than its first books; the document that
  crosses the budget is the last one yielded.
  """
  from compressive.data import iterator as iterator_lib  # pylint: disable=g-import-not-at-top

  docs = get_documents(data_config, split, tokenizers.ByteTokenizer())
  if not isinstance(docs, documents_lib.TextDocuments):
    raise DataError(
        f'data.source={data_config.source} has no text to train a tokenizer '
        'on (it is read as bytes or tokens)')
  total = 0
  for i in iterator_lib.epoch_permutation(seed, 0, len(docs)):
    text = docs.text(int(i))
    yield text
    total += len(text.encode('utf-8'))
    if max_bytes is not None and total >= max_bytes:
      return
