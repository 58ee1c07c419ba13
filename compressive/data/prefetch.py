"""Whole steps' batches, made ahead in a background thread.

    steps = StepIterator(segment_iterator, segments_per_step, put=to_device)
    with Prefetcher(steps, depth=2) as batches:
      batch = next(batches)        # made (and transferred) while the device ran
      state = batches.get_state()  # the position after the batches CONSUMED

`StepIterator` stacks `segments_per_step` consecutive segments into one
step's batch `[S, b, ...]` and hands it to `put` (training transfers it to
its device sharding there, so the transfer too happens ahead of the step).
Its state is the segment iterator's.

`Prefetcher` runs it in one thread through Grain's
`ThreadPrefetchDatasetIterator` (a bounded queue of `depth` elements, each
stored with the iterator state right after it was made): `get_state()` is
the position after the last batch the caller took, never after the ones
made ahead, so a checkpoint of it resumes exactly where the consumer was
(docs/DESIGN.md §The loop keeps the device busy). An exception raised
while making a batch (an unreadable book, a bad encoding) is raised by the
`next()` that would have returned that batch, in the caller's thread, after
every batch before it. Leaving the `with` block stops and joins the thread.

Nothing here reads flags or imports JAX: `put` is the caller's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

if TYPE_CHECKING:  # the segments StepIterator stacks, named for the type checker only
  from compressive.data.iterator import SegmentIterator


def stack_segments(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """S segments' batches [b, ...] -> one step's batch [S, b, ...]."""
  return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


class StepIterator:
  """One training step's batch per `next()`: S consecutive segments of every
  row of `segments` (a SegmentIterator), stacked and passed through `put`."""

  def __init__(
    self,
    segments: SegmentIterator,
    segments_per_step: int,
    put: Optional[Callable[[dict[str, np.ndarray]], Any]] = None,
  ) -> None:
    self.segments = segments
    self.segments_per_step = segments_per_step
    self.put = put

  def __iter__(self) -> "StepIterator":
    return self

  def __next__(self) -> Any:
    local = stack_segments([next(self.segments) for _ in range(self.segments_per_step)])
    return local if self.put is None else self.put(local)

  def get_state(self) -> dict[str, np.ndarray]:
    return self.segments.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self.segments.set_state(state)


class Prefetcher:
  """`iterator` (get_state / set_state / next) run `depth` elements ahead in
  one background thread; depth 0 runs it in the caller's thread.

  Use it as a context manager: leaving the block stops the thread (at most
  the element it is making finishes) and drops it, so no thread outlives
  the block and nothing is left for the interpreter's shutdown to close.
  """

  def __init__(self, iterator: StepIterator, depth: int) -> None:
    if depth < 0:
      raise ValueError(f"prefetch depth {depth} must be >= 0")
    self.depth = depth
    self._source = iterator
    self._iterator: Any = None  # the source, or Grain's iterator running it ahead
    self._closed_state: Optional[dict[str, Any]] = None  # get_state() once closed

  def __enter__(self) -> "Prefetcher":
    if self.depth == 0:
      self._iterator = self._source
    else:
      # Imported here: only training prefetches, and Grain takes a moment
      # to import.
      from grain import experimental as grain_experimental

      self._iterator = grain_experimental.ThreadPrefetchDatasetIterator(self._source, self.depth)
    return self

  def __iter__(self) -> "Prefetcher":
    return self

  def __next__(self) -> Any:
    if self._iterator is None:
      raise RuntimeError("Prefetcher is used outside its `with` block")
    return next(self._iterator)

  def get_state(self) -> dict[str, Any]:
    """The position after the last element taken by `next()`."""
    if self._iterator is not None:
      return self._iterator.get_state()
    if self._closed_state is not None:
      return self._closed_state
    return self._source.get_state()  # not started: nothing made ahead

  def close(self) -> None:
    iterator, self._iterator = self._iterator, None
    if iterator is not None:
      self._closed_state = iterator.get_state()
      if iterator is not self._source:
        iterator.close()

  def __exit__(self, *exc: object) -> None:
    self.close()
