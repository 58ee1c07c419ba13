"""Synthetic documents for tests and smoke runs: fast, offline, seeded.

Lengths are uniform in [synthetic_min_length, synthetic_max_length]; tokens
lie in [1, vocab_size) (0 is left to padding). Kinds:
- 'random': i.i.d. tokens; nothing to learn beyond the unigram distribution.
- 'copy': a random block of `synthetic_period` tokens repeated to the
  document's length; everything after the first block is predictable by a
  model whose memory reaches `synthetic_period` tokens back, so it probes
  the memory (e.g. a period longer than the segment).
Each split draws from its own stream of (synthetic_seed, split). Each token
counts as one word and one byte.
"""

from __future__ import annotations

import ml_collections
import numpy as np

from compressive.errors import DataError
from compressive.data import documents as documents_lib
from compressive.data import tokenizers

SPLITS = ('train', 'validation', 'test')


def make_documents(num_docs: int, min_length: int, max_length: int,
                   vocab_size: int, seed: int, kind: str = 'random',
                   period: int = 64) -> list[np.ndarray]:
  """`num_docs` int32 token arrays drawn from np.random.default_rng(seed)."""
  if not 1 <= min_length <= max_length:
    raise DataError(
        f'need 1 <= synthetic_min_length ({min_length}) <= '
        f'synthetic_max_length ({max_length})')
  if vocab_size < 2:
    raise DataError(f'vocab_size must be >= 2, got {vocab_size}')
  if kind not in ('random', 'copy'):
    raise DataError(
        f"data.synthetic_kind must be 'random' or 'copy', got {kind!r}")
  rng = np.random.default_rng(seed)
  lengths = rng.integers(min_length, max_length + 1, size=num_docs)
  docs = []
  for length in lengths:
    if kind == 'random':
      doc = rng.integers(1, vocab_size, size=length)
    else:
      block = rng.integers(1, vocab_size, size=period)
      doc = np.resize(block, length)  # Repeats block to the length.
    docs.append(doc.astype(np.int32))
  return docs


def get_documents(data_config: ml_collections.ConfigDict, split: str,
                  tokenizer: tokenizers.Tokenizer
                  ) -> documents_lib.TokenDocuments:
  if split not in SPLITS:
    raise DataError(f'split must be one of {SPLITS}, got {split!r}')
  k = SPLITS.index(split)
  docs = make_documents(
      num_docs=int(data_config.synthetic_num_docs[k]),
      min_length=data_config.synthetic_min_length,
      max_length=data_config.synthetic_max_length,
      vocab_size=tokenizer.vocab_size,
      seed=int(np.random.SeedSequence(
          [data_config.synthetic_seed, k]).generate_state(1)[0]),
      kind=data_config.synthetic_kind,
      period=data_config.synthetic_period)
  return documents_lib.TokenDocuments(docs, description=f'synthetic/{split}')
