"""A synthetic long-range recall task: facts planted in filler, queried later.

Each document is byte text: filler words of lowercase letters, with facts
`<KEY=VALUE>` (KEY four capitals, VALUE four digits) planted at random places
and each queried once, `<KEY?VALUE>`, a chosen number of bytes later. The four
VALUE bytes of a query can only be predicted by recalling the fact, so
accuracy on them as a function of the fact-to-query distance measures how far
back a model's memory reaches: a Transformer-XL reaches num_layers x
memory_length tokens, a Compressive Transformer num_layers x (memory_length +
rate x compressed_memory_length).

Config fields (config.data): recall_distances (distances in bytes between a
fact and its query, one drawn per fact), recall_doc_length (bytes per
document), recall_facts (facts per document), synthetic_num_docs (documents
per split, shared with `synthetic`), synthetic_seed.
"""

from __future__ import annotations

import dataclasses
import string

import ml_collections
import numpy as np

from compressive.errors import DataError
from compressive.data import documents as documents_lib

SPLITS = ("train", "validation", "test")
KEY_LEN = VALUE_LEN = 4
_EVENT_LEN = 1 + KEY_LEN + 1 + VALUE_LEN + 1  # "<KEY=VALUE>"


@dataclasses.dataclass(frozen=True)
class Query:
  answer_start: int  # byte offset of the first VALUE byte of the query
  distance: int  # bytes from the fact's start to the query's start


def make_document(rng: np.random.Generator, length: int, num_facts: int,
                  distances: tuple[int, ...]) -> tuple[str, list[Query]]:
  """One document of exactly `length` bytes and its queries."""
  occupied = np.zeros(length, bool)
  events = []  # (start, text, query or None)
  for _ in range(num_facts):
    for _ in range(100):  # rejection sampling of non-overlapping placements
      d = int(rng.choice(distances))
      if d + _EVENT_LEN > length:
        break
      start = int(rng.integers(0, length - d - _EVENT_LEN + 1))
      spans = [(start, start + _EVENT_LEN), (start + d, start + d + _EVENT_LEN)]
      # Keep one byte of filler around every event so they never touch.
      if d < _EVENT_LEN + 1 or any(
          occupied[max(a - 1, 0):min(b + 1, length)].any() for a, b in spans):
        continue
      key = "".join(rng.choice(list(string.ascii_uppercase), KEY_LEN))
      value = "".join(rng.choice(list(string.digits), VALUE_LEN))
      for a, b in spans:
        occupied[a:b] = True
      events.append((start, f"<{key}={value}>", None))
      events.append((start + d, f"<{key}?{value}>", d))
      break
  chars = list(_filler(rng, length))
  queries = []
  for start, text, distance in events:
    chars[start:start + _EVENT_LEN] = text
    if distance is not None:
      queries.append(Query(answer_start=start + 1 + KEY_LEN + 1, distance=distance))
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

  def __init__(self, texts: list[str], queries: list[list[Query]], tokenizer, description: str):
    super().__init__(names=[f"recall/{i}" for i in range(len(texts))],
                     load_text=lambda i: texts[i], tokenizer=tokenizer,
                     description=description)
    self._queries = queries

  def queries(self, i: int) -> list[Query]:
    return self._queries[i]


def get_documents(data_config: ml_collections.ConfigDict, split: str, tokenizer) -> RecallDocuments:
  if split not in SPLITS:
    raise DataError(f"split must be one of {SPLITS}, got {split!r}")
  if getattr(tokenizer, "vocab_size", None) != 256:
    raise DataError("data.source=recall is byte text: use data.tokenizer=bytes")
  k = SPLITS.index(split)
  seed = int(np.random.SeedSequence([data_config.synthetic_seed, 7, k]).generate_state(1)[0])
  rng = np.random.default_rng(seed)
  distances = tuple(int(d) for d in data_config.recall_distances)
  if not distances or min(distances) <= _EVENT_LEN:
    raise DataError(f"data.recall_distances={distances} must be > {_EVENT_LEN} bytes each")
  texts, queries = [], []
  for _ in range(int(data_config.synthetic_num_docs[k])):
    text, q = make_document(rng, int(data_config.recall_doc_length),
                            int(data_config.recall_facts), distances)
    texts.append(text)
    queries.append(q)
  return RecallDocuments(texts, queries, tokenizer, f"recall/{split}")
