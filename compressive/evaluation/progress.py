"""The progress line of a stream (compressive/evaluation/evaluate.py):
segments done, tokens per second and the time left, on the "compressive"
logger while an evaluation or an analysis streams a split.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from compressive.values import hms

_log = logging.getLogger("compressive")


class Progress:
  """A progress line on the "compressive" logger (stderr in the tools):
  `<what>: segment i/total, x tok/s, ETA h:mm:ss`, every `every_s` seconds
  (<= 0: every segment). Timed from the end of the first segment, so that
  compilation counts in neither the rate nor the ETA; nothing is logged
  before a second segment."""

  def __init__(
    self, what: str, total: Optional[int], tokens_per_segment: int, every_s: float = 10.0
  ) -> None:
    self.what, self.total, self.tokens, self.every_s = what, total, tokens_per_segment, every_s
    self._start: Optional[tuple[float, int]] = None  # (time, segments) after the first
    self._last = 0.0

  def update(self, done: int) -> None:
    """`done` segments are dispatched (per row)."""
    now = time.time()
    if self._start is None:
      self._start, self._last = (now, done), now
      return
    if now - self._last < self.every_s:
      return
    self._last = now
    rate = (done - self._start[1]) / max(now - self._start[0], 1e-9)  # segments / s
    total = "?" if self.total is None else str(self.total)
    eta = "?" if self.total is None else hms((self.total - done) / max(rate, 1e-9))
    _log.info(
      "%s: segment %d/%s, %.0f tok/s, ETA %s", self.what, done, total, rate * self.tokens, eta
    )
