"""Documents: random access to the token streams of one split of a corpus.

A document of L tokens gives L - 1 predictions (inputs doc[:-1], targets
doc[1:]); its first token is context only. A document with fewer than 2
tokens would give nothing to predict and would silently vanish from the
statistics, so asking for its tokens is an error that names it.

`num_words` and `num_bytes` describe the ORIGINAL text of a document and are
the normalisers of word-level perplexity (PG-19) and bits per byte; they do
not depend on the tokenizer.
"""

from __future__ import annotations

import abc
import collections
import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from compressive.data import tokenizers
from compressive.data.registry import SPLITS
from compressive.errors import DataError, UserError


class Documents(abc.ABC):
  """One split of a corpus: `len(docs)` documents with random access."""

  def __init__(self, description: str):
    # Names the corpus and split in error messages, e.g. 'books/train'.
    self.description = description

  @abc.abstractmethod
  def __len__(self) -> int: ...

  @abc.abstractmethod
  def name(self, i: int) -> str:
    """A human-readable name of document i (a title or a file name)."""

  @abc.abstractmethod
  def _load_tokens(self, i: int) -> np.ndarray:
    """Token ids of document i, int32 [L_i], without length checks."""

  @abc.abstractmethod
  def num_words(self, i: int) -> int:
    """Whitespace-separated words of the original text of document i."""

  @abc.abstractmethod
  def num_bytes(self, i: int) -> int:
    """UTF-8 bytes of the original text of document i."""

  def tokens(self, i: int) -> np.ndarray:
    """Token ids of document i, int32 [L_i] with L_i >= 2.

    A Documents class defined outside this package (a plugin source's) is
    held to the contract: its `_load_tokens` gives a 1-D integer numpy array
    of token ids in [0, 2**31), and an error it raises is a DataError
    naming it (a built-in one's is a bug and keeps its traceback)."""
    self._check_index(i)
    if type(self).__module__.startswith("compressive."):
      ids = self._load_tokens(i)
    else:
      try:
        ids = self._load_tokens(i)
      except (UserError, OSError):
        raise
      except Exception as e:
        raise DataError(
          f"{type(self).__module__}.{type(self).__name__}._load_tokens({i}) of "
          f"{self.description} raised {type(e).__name__}: "
          f"{' '.join(str(e).split())[:300]}"
        ) from e
      self._check_ids(i, ids)
    if len(ids) < 2:
      raise DataError(
        f"Document {self.name(i)!r} (index {i} of {self.description}) has "
        f"{len(ids)} token(s); a document needs at least 2 tokens to give "
        "one prediction. Remove or merge it."
      )
    return ids

  def _check_ids(self, i: int, ids: Any) -> None:  # what _load_tokens gave: anything
    """DataError unless `ids` is a 1-D integer array of token ids in [0, 2**31)."""
    ok = isinstance(ids, np.ndarray) and ids.ndim == 1 and np.issubdtype(ids.dtype, np.integer)
    if ok and ids.size:
      ok = int(ids.min()) >= 0 and int(ids.max()) < 2**31
    if not ok:
      what = f"{ids.dtype}{list(ids.shape)}" if isinstance(ids, np.ndarray) else type(ids).__name__
      raise DataError(
        f"document {i} of {self.description} ({type(self).__name__}) gives {what} as its "
        "tokens; a Documents gives a 1-D integer numpy array of token ids in [0, 2**31)"
      )

  def num_tokens(self, i: int) -> int:
    """len(tokens(i)); sources that know it without tokenizing override."""
    return len(self.tokens(i))

  def _check_index(self, i: int) -> None:
    if not 0 <= i < len(self):
      raise IndexError(
        f"document index {i} out of range for {self.description} ({len(self)} documents)"
      )


class _LruTokens:
  """Keeps recently used token arrays up to a total number of tokens."""

  def __init__(self, max_tokens: int):
    self.max_tokens = max_tokens
    self._items: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
    self._total = 0

  def get(self, i: int) -> np.ndarray | None:
    ids = self._items.get(i)
    if ids is not None:
      self._items.move_to_end(i)
    return ids

  def put(self, i: int, ids: np.ndarray) -> None:
    if len(ids) > self.max_tokens or i in self._items:
      return
    self._items[i] = ids
    self._total += len(ids)
    while self._total > self.max_tokens:
      _, old = self._items.popitem(last=False)
      self._total -= len(old)


class TextDocuments(Documents):
  """Documents given as text, tokenized on first use and cached.

  Texts are loaded through `load_text(i)` so that a corpus larger than memory
  (PG-19 train) is read one book at a time; word, byte and token counts are
  remembered per document (a few integers each) once computed.
  """

  def __init__(
    self,
    names: Sequence[str] | Callable[[int], str],
    load_text: Callable[[int], str],
    tokenizer: tokenizers.Tokenizer,
    description: str,
    cache_tokens: int = 1 << 26,
    num_documents: int | None = None,
  ):
    """Args:
    names: document names, or a function i -> name (then num_documents is
      required), for corpora where names cost a read (only used in errors).
    load_text: i -> original text of document i.
    tokenizer: turns texts into token ids.
    description: corpus/split, for error messages.
    cache_tokens: tokenized documents kept, in tokens (LRU).
    num_documents: number of documents when names is a function.
    """
    super().__init__(description)
    self._names: list[str] | None
    self._name_fn: Callable[[int], str] | None
    if callable(names):
      if num_documents is None:
        raise DataError("num_documents is required when names is a function")
      self._names, self._name_fn, n = None, names, num_documents
    else:
      self._names, self._name_fn = list(names), None
      n = len(self._names)
    self._num_documents = n
    self._load_text = load_text
    self.tokenizer = tokenizer
    self._cache = _LruTokens(cache_tokens)
    self._words = np.full([n], -1, np.int64)
    self._bytes = np.full([n], -1, np.int64)
    self._ntokens = np.full([n], -1, np.int64)

  def __len__(self) -> int:
    return self._num_documents

  def name(self, i: int) -> str:
    if self._names is not None:
      return self._names[i]
    assert self._name_fn is not None  # __init__ sets one of the two
    return self._name_fn(i)

  def text(self, i: int) -> str:
    """The original text of document i (what num_words/num_bytes count)."""
    self._check_index(i)
    return self._load_text(i)

  def _count(self, i: int, text: str | None = None) -> None:
    if self._words[i] < 0:
      text = self.text(i) if text is None else text
      self._words[i] = len(text.split())
      self._bytes[i] = len(text.encode("utf-8"))

  def _load_tokens(self, i: int) -> np.ndarray:
    ids = self._cache.get(i)
    if ids is None:
      text = self.text(i)
      self._count(i, text)
      ids = np.asarray(self.tokenizer.encode(text), dtype=np.int32)
      ids.setflags(write=False)
      self._ntokens[i] = len(ids)
      self._cache.put(i, ids)
    return ids

  def num_tokens(self, i: int) -> int:
    self._check_index(i)
    if self._ntokens[i] < 2:  # Unknown yet (-1), or too short: raises.
      self.tokens(i)
    return int(self._ntokens[i])

  def num_words(self, i: int) -> int:
    self._check_index(i)
    self._count(i)
    return int(self._words[i])

  def num_bytes(self, i: int) -> int:
    self._check_index(i)
    self._count(i)
    return int(self._bytes[i])


class ByteStreamDocuments(Documents):
  """Documents that are contiguous ranges of one byte buffer (enwik8).

  The bytes ARE the tokens: no decoding, so a range may begin or end inside
  a multi-byte UTF-8 character, exactly as in the standard enwik8 split.
  """

  def __init__(self, buffer: np.ndarray, bounds: Sequence[tuple[int, int]], description: str):
    super().__init__(description)
    if buffer.dtype != np.uint8 or buffer.ndim != 1:
      raise DataError("buffer must be a 1-D uint8 array")
    self._buffer = buffer  # uint8 [total bytes]
    self._bounds = [(int(a), int(b)) for a, b in bounds]

  def __len__(self) -> int:
    return len(self._bounds)

  def name(self, i: int) -> str:
    a, b = self._bounds[i]
    return f"{self.description}[bytes {a}:{b}]"

  def _load_tokens(self, i: int) -> np.ndarray:
    a, b = self._bounds[i]
    return self._buffer[a:b].astype(np.int32)

  def num_tokens(self, i: int) -> int:
    self._check_index(i)
    a, b = self._bounds[i]
    if b - a < 2:
      self.tokens(i)
    return b - a

  def num_bytes(self, i: int) -> int:
    self._check_index(i)
    a, b = self._bounds[i]
    return b - a

  def num_words(self, i: int) -> int:
    """Runs of non-whitespace bytes (ASCII whitespace, like bytes.split())."""
    self._check_index(i)
    a, b = self._bounds[i]
    chunk = self._buffer[a:b]
    space = np.isin(chunk, np.frombuffer(b" \t\n\r\x0b\x0c", np.uint8))
    starts = ~space & np.concatenate([[True], space[:-1]])
    return int(starts.sum())


class TokenDocuments(Documents):
  """Documents given directly as token arrays (synthetic data).

  There is no text: each token counts as one word and one byte.
  """

  def __init__(self, docs: Sequence[np.ndarray], description: str):
    super().__init__(description)
    for i, d in enumerate(docs):  # a plugin source builds these: held to the contract
      self._check_ids(i, np.asarray(d) if isinstance(d, (list, tuple)) else d)
    self._docs = [np.asarray(d, dtype=np.int32) for d in docs]

  def __len__(self) -> int:
    return len(self._docs)

  def name(self, i: int) -> str:
    return f"{self.description}[{i}]"

  def _load_tokens(self, i: int) -> np.ndarray:
    return self._docs[i]

  def num_tokens(self, i: int) -> int:
    return len(self.tokens(i))

  def num_words(self, i: int) -> int:
    self._check_index(i)
    return len(self._docs[i])

  def num_bytes(self, i: int) -> int:
    self._check_index(i)
    return len(self._docs[i])


def split_by_hash(keys: Sequence[str], fraction: float) -> dict[str, list[int]]:
  """Splits items into train / validation / test by a hash of their keys.

  Items are ordered by sha256(key); the first round(fraction * n) (at least
  one) go to validation, the next as many to test, the rest to train. The
  split depends only on the set of keys (not on their order or on the
  machine), and validation and test are never empty. Items that share a key
  (e.g. two editions of one play) always land in the same split.

  Returns:
    {'train': [...], 'validation': [...], 'test': [...]}: indices into keys,
    each list in increasing order.
  """
  groups = sorted(set(keys), key=lambda k: (hashlib.sha256(k.encode()).hexdigest(), k))
  if len(groups) < 3:
    raise DataError(
      f"Need at least 3 distinct documents to split into train / "
      f"validation / test by hash, got {len(groups)}"
    )
  if not 0 < fraction < 0.5:
    raise DataError(f"heldout_fraction must lie in (0, 0.5), got {fraction}")
  n_held = max(1, round(fraction * len(groups)))
  n_held = min(n_held, (len(groups) - 1) // 2)
  which = {}
  for rank, key in enumerate(groups):
    if rank < n_held:
      which[key] = "validation"
    elif rank < 2 * n_held:
      which[key] = "test"
    else:
      which[key] = "train"
  out: dict[str, list[int]] = {split: [] for split in SPLITS}
  for i, key in enumerate(keys):
    out[which[key]].append(i)
  return out
