"""Synthetic documents for tests and smoke runs: fast, offline, seeded.

Config (`config.data.synthetic`): lengths are uniform in [min_length,
max_length]; tokens lie in [1, vocab_size) (0 is left to padding);
num_docs documents per split (train, validation, test). Kinds:
- 'random': i.i.d. tokens; nothing to learn beyond the unigram distribution.
- 'copy': a random block of `period` tokens repeated to the document's
  length; everything after the first block is predictable by a model whose
  memory reaches `period` tokens back, so it probes the memory (e.g. a
  period longer than the segment).
Each split draws from its own stream of (seed, split). Each token counts as
one word and one byte.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from compressive import values
from compressive.data import documents as documents_lib
from compressive.data import registry, tokenizers
from compressive.errors import ConfigError, DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig

KINDS = ("random", "copy")


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.synthetic`: generated token documents."""

  kind: str = values.text("random", KINDS, "'random' or 'copy'")  # 'copy': a repeated random block
  num_docs: tuple = values.sequence((64, 8, 8))  # (train, validation, test)
  min_length: int = values.whole(2, "[1, 2**63)")
  max_length: int = values.whole(2048, "[1, 2**63)")
  period: int = values.whole(64, "[1, 2**63)")  # Block length of kind 'copy'.
  # NumPy's SeedSequence takes integers >= 0.
  seed: int = values.whole(0, "[0, 2**63)")

  def __post_init__(self) -> None:
    values.check_fields(self, "data.synthetic.")


def validate(data_config: "DataConfig") -> None:
  c = data_config.section(Config)
  if len(c.num_docs) != len(registry.SPLITS) or min(c.num_docs) < 0:
    raise ConfigError(
      f"data.synthetic.num_docs={tuple(c.num_docs)} must be "
      f"{len(registry.SPLITS)} counts >= 0, one per split"
    )
  if not 1 <= c.min_length <= c.max_length:
    raise ConfigError(
      f"data.synthetic.min_length={c.min_length} must be in "
      f"[1, data.synthetic.max_length={c.max_length}]"
    )


def host_bytes(data_config: "DataConfig") -> int:
  """The documents' expected bytes: int32 tokens of the mean length, each
  document's drawn length (int64), and the int64 block a 'copy' draws."""
  c = data_config.section(Config)
  block = 8 * c.period if c.kind == "copy" else 0
  return sum(c.num_docs) * (4 * (c.min_length + c.max_length) // 2 + 8 + block)


def make_documents(
  num_docs: int,
  min_length: int,
  max_length: int,
  vocab_size: int,
  seed: int,
  kind: str = "random",
  period: int = 64,
) -> list[np.ndarray]:
  """`num_docs` int32 token arrays drawn from np.random.default_rng(seed)."""
  if not 1 <= min_length <= max_length:
    raise DataError(
      f"need 1 <= data.synthetic.min_length ({min_length}) <= "
      f"data.synthetic.max_length ({max_length})"
    )
  if vocab_size < 2:
    raise DataError(f"vocab_size must be >= 2, got {vocab_size}")
  if kind not in KINDS:
    raise DataError(f"data.synthetic.kind must be 'random' or 'copy', got {kind!r}")
  rng = np.random.default_rng(seed)
  lengths = rng.integers(min_length, max_length + 1, size=num_docs)
  docs = []
  for length in lengths:
    if kind == "random":
      doc = rng.integers(1, vocab_size, size=length)
    else:
      block = rng.integers(1, vocab_size, size=period)
      doc = np.resize(block, length)  # Repeats block to the length.
    docs.append(doc.astype(np.int32))
  return docs


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.TokenDocuments:
  registry.check_split(split)
  c = data_config.section(Config)
  k = registry.SPLITS.index(split)
  docs = make_documents(
    num_docs=int(c.num_docs[k]),
    min_length=c.min_length,
    max_length=c.max_length,
    vocab_size=tokenizer.vocab_size,
    seed=int(np.random.SeedSequence([c.seed, k]).generate_state(1)[0]),
    kind=c.kind,
    period=c.period,
  )
  return documents_lib.TokenDocuments(docs, description=f"synthetic/{split}")


# Built in memory: counting every document's tokens costs a moment.
registry.register(
  registry.Source(
    name="synthetic",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    check_documents=registry.checks_every_document(get_documents),
    host_bytes=host_bytes,
  )
)
