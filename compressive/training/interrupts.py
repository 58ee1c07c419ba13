"""Stopping a run on a signal without losing what it saved.

`SignalStop` (train.py): the first stop signal (errors.STOP_SIGNALS:
SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU) asks the run to stop
after its step (it then checkpoints and exits with `errors.exit_status`, 128 + the
signal, as a shell reports a process the signal ended); a second stops it at
once with KeyboardInterrupt. In a run of several processes, SIGTERM is left to
JAX's preemption service, which tells every process and agrees on the step
to stop at (`StopAgreement` polls it); a first other stop signal is handed to it as a
SIGTERM. Python runs a handler between any two bytecodes, so the
KeyboardInterrupt may land anywhere:

- inside the few lines that start a checkpoint save, where Orbax would leave
  a temporary directory that nothing finishes: `deferred()` marks such
  stretches, and the interrupt is raised when the stretch ends;
- inside a garbage-collector callback or a __del__, where Python prints
  "Exception ignored" with a traceback and drops it: that one is kept quiet
  and raised by the next poll of `should_stop`, after the step in flight.

`StopAgreement` (the training loop): whether to stop after a step, the same
answer in every process; `agree`: any process's flag, in every process.

`hold_early_signals` / `release_early_signals` (train.py): a stop signal
that comes while the tool still imports (JAX takes a second) is held
instead of killing the process unheard (SIGTERM's default) or printing an
import's traceback (SIGINT's); once the tool's main() runs, a held or later
signal is a KeyboardInterrupt, which main() reports in one line, until
`SignalStop` takes over.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any, Callable, Iterator, Optional, TypedDict

from compressive.errors import STOP_SIGNALS


class _Deferral(TypedDict):
  depth: int
  pending: Optional[BaseException]


_deferral: _Deferral = {"depth": 0, "pending": None}
_received: list[int] = []  # the signals this module's handlers heard, first first


def received() -> Optional[int]:
  """The first stop signal a handler of this module heard (held early,
  raised as KeyboardInterrupt, or taken by `SignalStop`), or None."""
  return _received[0] if _received else None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
  """A stretch that `interrupt` must not break into: an interrupt that
  arrives inside is raised when the outermost such stretch ends."""
  _deferral["depth"] += 1
  try:
    yield
  finally:
    _deferral["depth"] -= 1
  if not _deferral["depth"] and _deferral["pending"] is not None:
    pending, _deferral["pending"] = _deferral["pending"], None
    raise pending


def interrupt(exc: BaseException) -> None:
  """Raises `exc` (from a signal handler) now, or at the end of the
  `deferred()` stretch the main thread is in."""
  if _deferral["depth"]:
    _deferral["pending"] = exc
    return
  raise exc


def preemption_service() -> bool:
  """Whether JAX's preemption service runs: in a run of several processes
  (after jax.distributed.initialize) unless jax_enable_preemption_service
  is off. It owns SIGTERM (a handler of its own, in C++), tells every
  process of a notice, and agrees on a step to stop at
  (`multihost_utils.reached_preemption_sync_point`)."""
  import jax

  # jax's Config stub declares only some of its flags.
  return jax.process_count() > 1 and bool(jax.config.jax_enable_preemption_service)  # type: ignore[attr-defined]


class _Holder:
  """The package's signal holder: a handler that keeps the signals it gets
  in `signals`, as the holder train.py installs does."""

  def __init__(self) -> None:
    self.signals: list[int] = []

  def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
    del frame
    self.signals.append(signum)
    _received.append(signum)


_hold = _Holder()
EARLY_SIGNALS = STOP_SIGNALS


def _adopt_holders() -> None:
  """Takes over the signals a holder installed by the script held (a
  function with a `signals` list: the repository's train.py installs one
  before anything of the package, and JAX, is imported)."""
  holders: dict[int, Any] = {
    id(h): h
    for h in map(signal.getsignal, EARLY_SIGNALS)
    if h is not _hold and isinstance(getattr(h, "signals", None), list)
  }
  for holder in holders.values():
    _hold.signals.extend(holder.signals)
    _received.extend(holder.signals)
    holder.signals.clear()


def hold_early_signals() -> None:
  """Holds the stop signals until `release_early_signals`."""
  _received.clear()  # a tool's start: what an earlier run in this process heard is not its
  _adopt_holders()
  for signum in EARLY_SIGNALS:
    signal.signal(signum, _hold)


def _raise_interrupt(signum: int, frame: Optional[FrameType]) -> None:
  del frame
  _received.append(signum)
  interrupt(KeyboardInterrupt())


def release_early_signals() -> None:
  """From now on the stop signals raise KeyboardInterrupt (until
  `SignalStop` takes over); raises it at once if one was held."""
  _adopt_holders()
  for signum in EARLY_SIGNALS:
    signal.signal(signum, _raise_interrupt)
  if _hold.signals:
    _hold.signals.clear()
    raise KeyboardInterrupt


class StopAgreement:
  """Whether to stop after a step, the same answer in every process.

  One process: `should_stop()`, a flag the host sets (a signal handler),
  polled every step. Several: a preemption notice (SIGTERM to any process)
  reaches every process through JAX's preemption service, which agrees on
  the step to stop at without a collective per step
  (`multihost_utils.reached_preemption_sync_point`, polled every step: a
  local check until a notice arrives); a request that comes another way
  (`should_stop` alone) is agreed at the next checkpoint step, where the
  processes meet anyway. Without the preemption service
  (`jax_enable_preemption_service=False`) every request waits for that.
  """

  def __init__(self, checkpoint_every_steps: int, should_stop: Optional[Callable[[], bool]]):
    import jax

    self.checkpoint_every_steps, self.should_stop = checkpoint_every_steps, should_stop
    self.processes = jax.process_count()

  def requested(self, step: int) -> bool:
    local = self.should_stop is not None and self.should_stop()
    if self.processes == 1:
      return local
    from jax.experimental import multihost_utils

    if preemption_service() and multihost_utils.reached_preemption_sync_point(step):
      return True
    every = self.checkpoint_every_steps
    if every and step % every == 0:
      return agree(local)
    return False


def agree(flag: bool) -> bool:
  """True when any process says so, so that every process stops at one step."""
  import jax
  from jax.experimental import multihost_utils
  import numpy as np

  if jax.process_count() == 1:
    return flag
  return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


class SignalStop:
  """A stop signal (preemption, Ctrl-C, a closed terminal, a scheduler's
  warning): finish the step, checkpoint, and exit with `errors.exit_status`
  (train.py).

  A second signal stops at once with KeyboardInterrupt. Python runs a signal
  handler between any two bytecodes, also inside a garbage-collector callback
  or a __del__, where an exception is printed as "Exception ignored" and
  dropped. Such a dropped interrupt is kept quiet here and raised by the next
  poll of `should_stop`, after the step in flight.

  Where JAX's preemption service runs (`preemption_service()`), SIGTERM is
  left to it (a second SIGTERM changes nothing there), and a first other
  stop signal is raised again as SIGTERM, so that it reaches every process.

  `with SignalStop() as stop:` puts back the handlers (and the hook) it
  found when the body ends: train.run leaves its caller's process as it was.
  """

  def __init__(self) -> None:
    self._requested = threading.Event()
    self._interrupt: Optional[KeyboardInterrupt] = None
    self._unraisablehook = sys.unraisablehook
    self._forward = preemption_service()
    self._previous: dict[int, Any] = {}
    for signum in STOP_SIGNALS:  # SIGTERM is JAX's preemption service's where it runs
      if signum != signal.SIGTERM or not self._forward:
        self._previous[signum] = signal.signal(signum, self._handler)
    sys.unraisablehook = self._quiet_dropped_interrupt

  def __enter__(self) -> SignalStop:
    return self

  def __exit__(self, *exc_info: Any) -> None:
    for signum, handler in self._previous.items():
      if signal.getsignal(signum) == self._handler:  # not since taken over
        signal.signal(signum, handler)
    if sys.unraisablehook == self._quiet_dropped_interrupt:
      sys.unraisablehook = self._unraisablehook

  def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
    del frame
    _received.append(signum)
    if self._requested.is_set():  # a second signal: give up at once
      self._interrupt = KeyboardInterrupt()
      interrupt(self._interrupt)
      return
    logging.getLogger("compressive").warning(
      "%s received: stopping after this step", signal.Signals(signum).name
    )
    self._requested.set()
    if self._forward:  # to JAX's preemption service, which tells the other processes
      signal.raise_signal(signal.SIGTERM)

  def _quiet_dropped_interrupt(self, unraisable: sys.UnraisableHookArgs) -> None:
    if self._interrupt is None or unraisable.exc_value is not self._interrupt:
      self._unraisablehook(unraisable)

  def should_stop(self) -> bool:
    if self._interrupt is not None:
      raise self._interrupt
    return self._requested.is_set()
