"""SegmentIterator: documents -> batches of consecutive segments per row.

Notation: B global batch size, b = num_rows rows materialised by this
process, T segment length, N documents in the split.

Each batch row is pinned to one document until that document ends, so that
row's memory (the Compressive Transformer's mem / cmem, docs/DESIGN.md §The
memory's life cycle) carries the document's own past from one segment to the
next. A document of L tokens gives L - 1 predictions, cut into
ceil((L - 1) / T) segments; the last one is padded (inputs / targets 0, mask
False), and the row's next segment starts the next document with
start_of_sequence True, which resets the row's memory. No token is lost or
repeated.

Which row reads which document is a pure function of (seed, epoch, N, B), so
every process computes its own rows without talking to the others: in epoch e
the documents are permuted by a hash of (seed, e) (no permutation when
shuffle is off, the default for repeat=False), and global row r reads
permutation positions r, r + B, r + 2B, ... . Rows keep their own epoch
counters: with repeat=True a row that finishes its share of epoch e goes on
with its share of epoch e + 1 while other rows may still be in epoch e.

With repeat=False each document is read exactly once. A row with nothing
left yields all-padding segments (mask False, start_of_sequence False), and
StopIteration comes once every row of the GLOBAL batch is exhausted: the
number of batches is computed up front from the token counts of all N
documents (one tokenization pass over the split on every process, cached by
the documents), so all processes of a multi-host evaluation stop at the same
step. That is cheap for evaluation splits; avoid repeat=False over a huge
training split.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from compressive.data import documents as documents_lib
from compressive.errors import DataError

_M64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
  """SplitMix64 finaliser: a bijection of uint64 that scrambles all bits."""
  # uint64 arrays wrap on overflow, which is what the hash wants.
  z = x + np.uint64(0x9E3779B97F4A7C15)
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  """The document order of one epoch: int64 [n], a permutation of range(n).

  Defined by this code alone (a SplitMix64 hash of (seed, epoch, i), then
  argsort), not by a NumPy generator whose stream may change between
  versions: a checkpoint resumes on the same documents after an upgrade.
  """
  h = _splitmix64(np.array([seed & _M64], np.uint64))
  h = _splitmix64(h ^ np.array([epoch & _M64], np.uint64))
  # i -> i ^ h is a bijection and so is _splitmix64: no ties between keys.
  keys = _splitmix64(np.arange(n, dtype=np.uint64) ^ h)
  return np.argsort(keys, kind="stable").astype(np.int64)


def _check_arguments(
  docs: documents_lib.Documents,
  batch_size: int,
  segment_length: int,
  seed: int,
  repeat: bool,
  row_start: int,
  num_rows: int,
) -> None:
  """DataError for arguments a SegmentIterator cannot read with."""
  if batch_size < 1 or segment_length < 1:
    raise DataError(
      f"batch_size ({batch_size}) and segment_length ({segment_length}) must be positive"
    )
  if not (0 <= row_start and 1 <= num_rows and row_start + num_rows <= batch_size):
    raise DataError(
      f"rows [{row_start}, {row_start} + {num_rows}) do not lie within "
      f"the global batch of {batch_size} rows"
    )
  if seed < 0:
    raise DataError(f"seed must be non-negative, got {seed}")
  n = len(docs)
  if repeat and n < batch_size:
    raise DataError(
      f"{docs.description} has {n} documents but the batch has "
      f"{batch_size} rows; training pins each row to its own documents and "
      "needs at least batch_size documents: lower batch_size, or give the "
      "split more documents (text_files: more files, or one file with a "
      "smaller data.text_files.document_bytes; enwik8: more "
      "data.enwik8.train_shards)"
    )


class SegmentIterator(Iterator[dict[str, np.ndarray]]):
  """Yields {'inputs', 'targets', 'mask', 'start_of_sequence'} batches.

  Shapes: inputs / targets int32 [b, T]; mask bool [b, T] (True where targets
  is a real prediction); start_of_sequence bool [b] (True on the first
  segment of every document of a row, and only there).

  `get_state()` / `set_state()` capture the position of this process's rows
  (not the tokens), so an iterator built with the same arguments resumes
  exactly. The state is process-local: in a multi-host run each process
  saves and restores its own.
  """

  def __init__(
    self,
    docs: documents_lib.Documents,
    batch_size: int,
    segment_length: int,
    seed: int = 0,
    repeat: bool = True,
    row_start: int = 0,
    num_rows: int | None = None,
    shuffle: bool | None = None,
    vocab_size: int | None = None,
    source: str = "",
  ):
    """Builds the iterator at the start of epoch 0.

    Args:
      docs: the split to read.
      batch_size: B, rows of the GLOBAL batch.
      segment_length: T, tokens per segment.
      seed: seeds the per-epoch document permutations.
      repeat: True for training (endless, per-row epochs); False for one
        evaluation pass that reads each document exactly once.
      row_start: first global row materialised by this process.
      num_rows: rows materialised by this process (default: all from
        row_start to B), i.e. global rows [row_start, row_start + num_rows).
      shuffle: permute documents each epoch; defaults to `repeat`, so that
        evaluation reads documents in their natural order.
      vocab_size: model.vocab_size: a document holding a token id at or
        above it is a DataError naming `source` (data.source) and the
        document when a row first reads it, not an embedding lookup that
        reads past the table (on an accelerator, silently) and a loss that
        blames the learning rate. None: not checked.
      source: data.source, for that message.
    """
    if num_rows is None:
      num_rows = batch_size - row_start
    _check_arguments(docs, batch_size, segment_length, seed, repeat, row_start, num_rows)
    self.docs = docs
    self.vocab_size, self.source = vocab_size, source
    self.batch_size = batch_size
    self.segment_length = segment_length
    self.seed = seed
    self.repeat = repeat
    self.shuffle = repeat if shuffle is None else shuffle
    self.row_start = row_start
    self.num_rows = num_rows
    self._rows = np.arange(row_start, row_start + num_rows, dtype=np.int64)
    self._perms: dict[int, np.ndarray] = {}
    self._num_batches: int | None = None
    self._reset_position()

  def _reset_position(self) -> None:
    b = self.num_rows
    self._epoch = np.zeros([b], np.int64)  # Per-row epoch.
    self._position = np.zeros([b], np.int64)  # k: reads perm[r + k * B].
    self._offset = np.zeros([b], np.int64)  # Predictions done in the doc.
    self._step = 0
    self._row_cache: list[tuple[int, np.ndarray] | None] = [None] * b

  # -- Which document a row reads. ------------------------------------------

  def _permutation(self, epoch: int) -> np.ndarray:
    perm = self._perms.get(epoch)
    if perm is None:
      n = len(self.docs)
      if self.shuffle:
        perm = epoch_permutation(self.seed, epoch, n)
      else:
        perm = np.arange(n, dtype=np.int64)
      if len(self._perms) >= 4:  # Rows are rarely more than an epoch apart.
        self._perms.pop(min(self._perms))
      self._perms[epoch] = perm
    return perm

  def _document(self, j: int) -> int | None:
    """Index of the document local row j reads now; None when exhausted."""
    p = self._rows[j] + self._position[j] * self.batch_size
    if p >= len(self.docs):
      return None  # Only with repeat=False: _advance rolls epochs over.
    return int(self._permutation(int(self._epoch[j]))[p])

  def _tokens(self, j: int, doc: int) -> np.ndarray:
    cached = self._row_cache[j]
    if cached is None or cached[0] != doc:
      cached = (doc, self._checked(doc, self.docs.tokens(doc)))
      self._row_cache[j] = cached
    return cached[1]

  def _checked(self, doc: int, ids: np.ndarray) -> np.ndarray:
    """ids, when every one lies below vocab_size (the lower end is the
    Documents contract's)."""
    if self.vocab_size is not None and ids.size and int(ids.max()) >= self.vocab_size:
      raise DataError(
        f"data.source={self.source!r}: document {self.docs.name(doc)!r} (index {doc} of "
        f"{self.docs.description}) holds token id {int(ids.max())}, outside the model's "
        f"vocabulary (model.vocab_size={self.vocab_size}); a source gives ids in "
        "[0, model.vocab_size)"
      )
    return ids

  def _advance(self, j: int) -> None:
    """Moves local row j to its next document (next epoch if repeating)."""
    self._position[j] += 1
    self._offset[j] = 0
    self._row_cache[j] = None
    p = self._rows[j] + self._position[j] * self.batch_size
    if self.repeat and p >= len(self.docs):
      self._epoch[j] += 1
      self._position[j] = 0

  # -- Length of an evaluation pass. -----------------------------------------

  @property
  def num_batches(self) -> int | None:
    """Batches in one pass with repeat=False (all global rows); else None."""
    return None if self.repeat else self._pass_batches()

  def _pass_batches(self) -> int:
    """num_batches of a pass with repeat=False, counted on first use."""
    if self._num_batches is None:
      n, bsz, t = len(self.docs), self.batch_size, self.segment_length
      perm = self._permutation(0)
      segments = np.zeros([bsz], np.int64)
      for p in range(n):
        predictions = self.docs.num_tokens(int(perm[p])) - 1
        segments[p % bsz] += -(-predictions // t)
      self._num_batches = int(segments.max()) if n else 0
    return self._num_batches

  # -- Iteration. ------------------------------------------------------------

  def __iter__(self) -> "SegmentIterator":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if not self.repeat and self._step >= self._pass_batches():
      raise StopIteration
    b, t = self.num_rows, self.segment_length
    inputs = np.zeros([b, t], np.int32)
    targets = np.zeros([b, t], np.int32)
    mask = np.zeros([b, t], bool)
    start = np.zeros([b], bool)
    for j in range(b):
      doc = self._document(j)
      if doc is None:
        continue  # Exhausted row of an evaluation pass: all padding.
      ids = self._tokens(j, doc)  # [L]
      o = int(self._offset[j])
      n = min(t, len(ids) - 1 - o)
      inputs[j, :n] = ids[o : o + n]
      targets[j, :n] = ids[o + 1 : o + 1 + n]
      mask[j, :n] = True
      start[j] = o == 0
      self._offset[j] = o + n
      if o + n == len(ids) - 1:
        self._advance(j)
    self._step += 1
    return {
      "inputs": inputs,
      "targets": targets,
      "mask": mask,
      "start_of_sequence": start,
    }

  # -- Checkpointing. --------------------------------------------------------

  def _arguments(self) -> dict[str, int]:
    return {
      "num_documents": len(self.docs),
      "batch_size": self.batch_size,
      "segment_length": self.segment_length,
      "seed": self.seed,
      "repeat": int(self.repeat),
      "shuffle": int(self.shuffle),
      "row_start": self.row_start,
      "num_rows": self.num_rows,
    }

  def get_state(self) -> dict[str, np.ndarray]:
    """The position as a flat dict of int64 numpy arrays (no pickling).

    'epoch', 'position', 'offset' are [num_rows] (per local row: epoch, k-th
    document of the row's share, predictions done in it); 'step' counts the
    batches yielded. The remaining scalar entries record the arguments, so
    that restoring into a differently built iterator is an error rather than
    a silent change of data order.
    """
    # Multi-host: the [num_rows] arrays are this process's rows only, laid
    # out like its rows of the batch; to keep all processes' rows in one
    # checkpoint, assemble them into global [B] arrays sharded like the
    # batch (e.g. jax.make_array_from_process_local_data) and hand each
    # process its own rows back on restore. The scalars agree everywhere.
    state = {
      "epoch": self._epoch.copy(),
      "position": self._position.copy(),
      "offset": self._offset.copy(),
      "step": np.asarray(self._step, np.int64),
    }
    for key, value in self._arguments().items():
      state[key] = np.asarray(value, np.int64)
    return state

  def set_state(self, state: dict[str, Any], *, other_documents: bool = False) -> None:
    """Continues from `state` (from get_state of an identically built one).

    `other_documents` (a resume that accepts a changed corpus): a state
    saved over another number of documents goes on at the start of the
    next epoch of every row (the saved positions index documents that are
    no longer where they were), with the batch count kept; every other
    argument must still agree."""
    mismatched = []
    for key, value in self._arguments().items():
      if key not in state:
        raise DataError(f"iterator state lacks {key!r}")
      if int(np.asarray(state[key])) != value:
        mismatched.append(f"{key}: state {int(np.asarray(state[key]))}, iterator {value}")
    if mismatched and other_documents and all(m.startswith("num_documents:") for m in mismatched):
      self._reset_position()
      self._epoch[:] = int(np.max(np.asarray(state["epoch"]))) + 1
      self._step = int(np.asarray(state["step"]))
      return
    if mismatched:
      raise DataError(
        "iterator state was saved by an iterator built differently: " + "; ".join(mismatched)
      )
    b = self.num_rows
    arrays = {}
    for key in ("epoch", "position", "offset"):
      arrays[key] = np.asarray(state[key], np.int64).reshape(-1).copy()
      if arrays[key].shape != (b,):
        raise DataError(f"iterator state {key!r} has shape {arrays[key].shape}, expected ({b},)")
    self._reset_position()
    self._epoch = arrays["epoch"]
    self._position = arrays["position"]
    self._offset = arrays["offset"]
    self._step = int(np.asarray(state["step"]))
