"""A synthetic long-range recall task: facts planted in filler, queried later.

Each document is byte text: filler words of lowercase letters, with facts
`<KEY=VALUE>` (KEY four capitals, VALUE `value_len` digits, four by default)
planted at random places
and each queried once, `<KEY?VALUE>`, a chosen number of bytes later. With
`requery_distances`, each fact is first queried at one of those (near)
distances and then again at one of `distances` after that first query. The four
VALUE bytes of a query can only be predicted by recalling the fact, so
accuracy on them as a function of the fact-to-query distance measures how far
back a model's memory reaches: a Transformer-XL reaches num_layers x
memory_length tokens, a Compressive Transformer num_layers x (memory_length +
rate x compressed_memory_length).

Config fields (config.data.recall): distances (distances in bytes between a
fact and its query, one drawn per fact), requery_distances (empty: each fact
is queried once; else the distances of a first, near query, the far one
following it), doc_length (bytes per document),
facts (facts per document), value_len (digits per value), num_docs
(documents per split: train, validation, test), seed.
"""

from __future__ import annotations

import dataclasses
import string
from typing import TYPE_CHECKING

import numpy as np

from compressive import values
from compressive.data import documents as documents_lib
from compressive.data import generated, registry
from compressive.errors import ConfigError, DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig
  from compressive.data.tokenizers import Tokenizer

KEY_LEN = 4
VALUE_LEN = 4  # the default of data.recall.value_len
MAX_VALUE_LEN = 16


def event_length(value_len: int = VALUE_LEN) -> int:
  """Bytes of a fact or a query: `<KEY=VALUE>`."""
  return 1 + KEY_LEN + 1 + value_len + 1


@dataclasses.dataclass(frozen=True)
class Query:
  answer_start: int  # byte offset of the first VALUE byte of the query
  # Bytes to the query's start from the start of the latest earlier
  # occurrence of its value: the fact, or the fact's previous query.
  distance: int
  first: bool = True  # the fact's first query
  value_len: int = VALUE_LEN  # answer bytes, from answer_start on


def make_document(
  rng: np.random.Generator,
  length: int,
  num_facts: int,
  distances: tuple[int, ...],
  requery_distances: tuple[int, ...] = (),
  value_len: int = VALUE_LEN,
) -> tuple[str, list[Query]]:
  """One document of exactly `length` bytes and its queries."""
  event = event_length(value_len)
  occupied = np.zeros(length, bool)
  # (start, text, query distance or None, first query)
  events: list[tuple[int, str, int | None, bool]] = []
  for _ in range(num_facts):
    for _ in range(100):  # rejection sampling of non-overlapping placements
      # Gaps between consecutive events: fact -> (near query ->) far query.
      gaps = [int(rng.choice(requery_distances))] if requery_distances else []
      gaps.append(int(rng.choice(distances)))
      if sum(gaps) + event > length:
        break
      start = int(rng.integers(0, length - sum(gaps) - event + 1))
      starts = list(np.cumsum([start] + gaps))
      spans = [(a, a + event) for a in starts]
      # Keep one byte of filler around every event so they never touch.
      if min(gaps) < event + 1 or any(
        occupied[max(a - 1, 0) : min(b + 1, length)].any() for a, b in spans
      ):
        continue
      key = "".join(rng.choice(list(string.ascii_uppercase), KEY_LEN))
      value = "".join(rng.choice(list(string.digits), value_len))
      for a, b in spans:
        occupied[a:b] = True
      events.append((starts[0], f"<{key}={value}>", None, False))
      for k, (a, gap) in enumerate(zip(starts[1:], gaps)):
        events.append((int(a), f"<{key}?{value}>", gap, k == 0))
      break
  chars = list(_filler(rng, length))
  queries: list[Query] = []
  for start, text, distance, first in events:
    chars[start : start + event] = text
    if distance is not None:
      queries.append(
        Query(
          answer_start=start + 1 + KEY_LEN + 1, distance=distance, first=first, value_len=value_len
        )
      )
  return "".join(chars), sorted(queries, key=lambda q: q.answer_start)


def _filler(rng: np.random.Generator, length: int) -> str:
  words = []
  total = 0
  while total <= length:  # joined length is total - 1
    w = "".join(rng.choice(list("etaoinshrdlucmfwyp"), int(rng.integers(2, 8))))
    words.append(w)
    total += len(w) + 1
  text = " ".join(words)[:length]
  return "e" + text[1:-1] + "e"  # no outer blank: documents keep exact offsets


class RecallDocuments(documents_lib.TextDocuments):
  """TextDocuments that also know where each document's answers are."""

  def __init__(
    self, texts: list[str], queries: list[list[Query]], tokenizer: Tokenizer, description: str
  ) -> None:
    super().__init__(
      names=[f"recall/{i}" for i in range(len(texts))],
      load_text=lambda i: texts[i],
      tokenizer=tokenizer,
      description=description,
    )
    self._queries = queries

  def queries(self, i: int) -> list[Query]:
    return self._queries[i]


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.recall`: the recall task's documents. The rules between fields
  (every fact and its queries fit a document) are `validate`'s."""

  # Bytes from a fact to its query; one drawn per fact.
  distances: tuple = values.sequence((64, 256, 1024))
  # Empty: one query per fact. Else a first query at one of these distances
  # from the fact, and the second at one of `distances` from the first.
  requery_distances: tuple = values.sequence(())
  doc_length: int = values.whole(4096, "[1, 2**31)")  # bytes per document
  facts: int = values.whole(8, "[1, 2**31)")  # facts per document
  # Digits per value (the answer bytes of a query).
  value_len: int = values.whole(VALUE_LEN, f"[1, {MAX_VALUE_LEN}]")
  num_docs: tuple = values.sequence((64, 8, 8))  # (train, validation, test)
  seed: int = values.whole(0, "[0, 2**63)")  # NumPy's SeedSequence's range

  def __post_init__(self) -> None:
    values.check_fields(self, "data.recall.")


def validate(data_config: "DataConfig") -> None:
  if data_config.tokenizer != "bytes":
    raise ConfigError("data.source='recall' is byte text: set data.tokenizer=bytes")
  _check(data_config.section(Config), ConfigError)


def _is_int(value: object) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check(c: Config, error: type[Exception]) -> None:
  """`error` naming the field unless every fact, with its queries, fits a
  document: a fact that cannot would be left out, and a document of filler
  alone teaches no recall."""
  event = event_length(c.value_len)  # the fields' own ranges are the section's (Config)
  distances = tuple(c.distances)
  requery = tuple(c.requery_distances)
  for name, given in (("distances", distances), ("requery_distances", requery)):
    if not all(_is_int(d) for d in given) or (given and min(given) <= event):
      raise error(f"data.recall.{name}={given} must be integers > {event} bytes each")
  if not distances:
    raise error("data.recall.distances=() is empty: give at least one distance")
  num_docs = tuple(c.num_docs)
  if len(num_docs) != len(registry.SPLITS) or not all(_is_int(n) and n >= 1 for n in num_docs):
    raise error(
      f"data.recall.num_docs={num_docs} must be {len(registry.SPLITS)} positive "
      f"integers, documents of {', '.join(registry.SPLITS)}"
    )
  events = 2 + bool(requery)  # a fact, its query (and a first query)
  if c.facts * events * (event + 1) > c.doc_length:
    raise error(
      f"data.recall.facts={c.facts} facts of {events} events ({event} bytes and a "
      f"byte apart each) cannot fit data.recall.doc_length={c.doc_length} bytes: at most "
      f"{c.doc_length // (events * (event + 1))}"
    )
  span = max(distances) + (max(requery) if requery else 0) + event
  if span > c.doc_length:
    raise error(
      f"data.recall.doc_length={c.doc_length} cannot hold a fact and its queries: the "
      f"longest span, distance {max(distances)}"
      + (f" after a first query at {max(requery)}" if requery else "")
      + f" plus the query's {event} bytes, is {span}; raise doc_length to at least "
      f"{span} or lower data.recall.distances"
    )


def host_bytes(data_config: "DataConfig") -> int:
  """Every document's text and its placement mask, a byte each per byte."""
  c = data_config.section(Config)
  return sum(c.num_docs) * 2 * c.doc_length


def get_documents(data_config: "DataConfig", split: str, tokenizer: Tokenizer) -> RecallDocuments:
  registry.check_split(split)
  if getattr(tokenizer, "vocab_size", None) != 256:
    raise DataError("data.source=recall is byte text: use data.tokenizer=bytes")
  c = data_config.section(Config)
  _check(c, DataError)
  # Generated once per config (its split and fields, and this module's code)
  # and read back from the cache after that (data/generated.py).
  texts, queries = generated.cached_documents(
    "recall",
    {"split": split, **dataclasses.asdict(c)},
    __file__,
    Query,
    lambda: _generate(c, split),
  )
  return RecallDocuments(texts, queries, tokenizer, f"recall/{split}")


def _generate(c: Config, split: str) -> tuple[list[str], list[list[Query]]]:
  k = registry.SPLITS.index(split)
  seed = int(np.random.SeedSequence([c.seed, 7, k]).generate_state(1)[0])
  rng = np.random.default_rng(seed)
  distances = tuple(int(d) for d in c.distances)
  requery = tuple(int(d) for d in c.requery_distances)
  texts, queries = [], []
  count = int(c.num_docs[k])
  progress = values.Progress(f"recall/{split}: generating {count:,} documents", count)
  for _ in range(count):
    text, q = make_document(
      rng, int(c.doc_length), int(c.facts), distances, requery, int(c.value_len)
    )
    texts.append(text)
    queries.append(q)
    progress.advance()
  if not any(queries):
    raise DataError(
      f"recall/{split}: no fact could be placed in its {len(texts)} documents of "
      f"{c.doc_length} bytes (data.recall.facts={c.facts} facts at distances {distances}); "
      "raise data.recall.doc_length or lower data.recall.facts"
    )
  return texts, queries


# Built in memory: counting every document's tokens costs a moment.
registry.register(
  registry.Source(
    name="recall",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    check_documents=registry.checks_every_document(get_documents),
    host_bytes=host_bytes,
  )
)
