"""The one place that talks to Orbax.

A checkpoint holds, under one step: the train state (parameters, optimizer
state, update count, RNG), the training memory, and the data iterator's
position, so that a resumed run continues exactly where it stopped. Arrays are
global (jax.Array over the mesh): every process writes its own shards of the
same checkpoint, and a restore may target another mesh. The
experiment config is written beside the checkpoints as JSON (`config.json`)
so that `compressive.load(workdir)` can rebuild the model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Callable, Iterator, Optional, TypeVar

from etils import epath
import numpy as np
import orbax.checkpoint as ocp

from compressive import remote, storage
from compressive.errors import CheckpointError, NonFiniteError
from compressive.training import integrity, interrupts, layout, orbax_errors, savedjson, trees
from compressive.training.integrity import DamagedCheckpointError
from compressive.training.orbax_errors import write_errno

_T = TypeVar("_T")


class _NoReadOnlyNotice(logging.Filter):
  """Drops Orbax's warning that a read-only manager's folder is read only:
  a reader asked for it (compressive.load from Python prints it otherwise)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Given directory is read only")


def _manager(
  directory: str, max_to_keep: Optional[int], create: bool, read_only: bool
) -> ocp.CheckpointManager:
  if read_only:
    # Evaluation, sampling and analysis never write, delete or clean up
    # anything, even while a training run is saving into the same workdir.
    # (save_interval_steps=0: what read_only sets, without Orbax's warning.)
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
  else:
    # The one trainer of the workdir (it holds its lock) removes what a save
    # that was killed or refused left half-written.
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=create, cleanup_tmp_directories=True
    )
  handlers = {
    "state": ocp.StandardCheckpointHandler(),
    "memory": ocp.StandardCheckpointHandler(),
    "data": ocp.JsonCheckpointHandler(),
    INTEGRITY: ocp.JsonCheckpointHandler(),
  }
  notice, absl_log = _NoReadOnlyNotice(), logging.getLogger("absl")
  absl_log.addFilter(notice)
  try:
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)
  finally:
    absl_log.removeFilter(notice)


def _entries(directory: str) -> frozenset[str]:
  """The names in `directory` now (none where it does not exist)."""
  try:
    return frozenset(p.name for p in epath.Path(directory).iterdir())
  except OSError:
    return frozenset()


def _listing(read: Callable[[], _T], attempts: int = 10) -> _T:
  """read(), again when a step folder vanished under it: Orbax lists the
  steps and then reads each one's metadata, and a trainer's rotation may
  delete a step in between (FileNotFoundError naming the step's file, or
  NotADirectoryError naming the step, as Orbax checks its folder first)."""
  for attempt in range(attempts):
    try:
      return read()
    except (FileNotFoundError, NotADirectoryError):
      if attempt == attempts - 1:
        raise
      time.sleep(0.05 * (attempt + 1))
  raise AssertionError("unreachable")


INTEGRITY = "integrity"
INTEGRITY_FILE = "metadata"  # what Orbax's JsonCheckpointHandler names the item's file
# Seconds between reads of a step that failed, before it is called damaged:
# a step being rotated away vanishes within them.
READ_RETRY_DELAYS = (0.1, 0.4, 1.5)


class MissingStepError(CheckpointError):
  """The asked-for step was never saved, or has been rotated away."""


class ShapeMismatchError(CheckpointError):
  """The checkpoint holds parameters of other shapes than the config's model:
  not damage, so --restore_intact never skips it."""


class CheckpointWriteError(CheckpointError):
  """The disk refused a save: full, read-only or not ours to write."""


class NonFiniteStateError(NonFiniteError):
  """A save refused: the state or memory to be written holds NaN or inf
  (`names`: the arrays, as the integrity record names them)."""

  def __init__(self, message: str, names: list[str]):
    super().__init__(message)
    self.names = names


def _cause(error: Exception) -> str:
  """Why a step could not be read, for its damage message."""
  if isinstance(error, savedjson.DamagedJSONError):  # names the file and the cause
    return (
      f"(its {os.path.basename(os.path.dirname(error.path))}/"
      f"{os.path.basename(error.path)}: {error.cause})"
    )
  first = str(error).splitlines()[0][:200] if str(error) else ""
  return f"({type(error).__name__}: {first})"


class Checkpointer:
  """Saves and restores (train state, memory, data position) by step.

  Every save also writes an integrity record (integrity.py: each array's
  fingerprint, whether it is finite, the data position's digest, the run's
  identity) that every restore compares, so flipped bytes, truncated files
  and NaNs are named as damage instead of restored.
  """

  def __init__(
    self,
    workdir: layout.Where,
    max_to_keep: Optional[int] = 3,
    create: bool = True,
    read_only: bool = False,
  ) -> None:
    run = layout.workdir(workdir).absolute()
    self.directory = run.checkpoints
    self.skipped = run.skipped  # the damaged steps moved aside
    self._manager = self._settled(lambda: _manager(self.directory, max_to_keep, create, read_only))
    # A workdir on Cloud Storage: each save, and the wait for one, within
    # its mirror's deadline (compressive/storage.py); None on a disk.
    self.deadline = run.deadline
    # What a damaged step's error advises: readers choose another step;
    # only the trainer skips damage.
    self.advice = (
      "read an older step with --step, or let train.py --restore_intact move the damaged ones aside"
      if read_only
      else "train.py --restore_intact resumes from the newest intact checkpoint"
    )
    orbax_errors.quiet_orbax_leftovers()

  def latest_step(self) -> Optional[int]:
    return _listing(self._manager.latest_step)

  def all_steps(self) -> list[int]:
    return sorted(_listing(self._manager.all_steps))

  def reload(self) -> None:
    """Re-reads the steps on disk (another process may have saved or rotated)."""
    self._settled(lambda: (self._manager.reload(), self._manager)[1])

  def _settled(
    self, read: Callable[[], ocp.CheckpointManager], attempts: int = 10
  ) -> ocp.CheckpointManager:
    """read() (a manager that has listed the steps), again while it found
    no step and the checkpoints folder changed under it: Orbax lists the
    folder and then checks each entry is a finished step, and a trainer may
    rename its new step into place and delete the old one in between, so
    that neither counts. A folder that stays the same is read once."""
    for attempt in range(attempts):
      before = _entries(self.directory)
      manager = _listing(read)
      if manager.all_steps() or _entries(self.directory) == before:
        break
      time.sleep(0.05 * (attempt + 1))
    return manager

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def save(
    self,
    step: int,
    state: Any,
    memory: Any,
    data_state: dict[str, np.ndarray],
    identity: dict[str, Any],
  ) -> None:
    """Every process calls this; each writes its shards of `state` and
    `memory`, and the primary process writes `data_state` (the iterator
    position of every batch row) as JSON.

    The integrity record holds the arrays' checksums, a digest of the data
    position, and `identity` (`run_identity`: the model config, the
    tokenizer's identity, the corpus's digest), which restores compare."""
    data_json = {k: np.asarray(v).tolist() for k, v in data_state.items()}
    items = dict(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_json))
    stored = trees.nonempty_fields(memory)
    if stored:  # a segment-local model has no memory to store
      items["memory"] = ocp.args.StandardSave(stored)
    record = integrity.record(state, stored, data_json, identity)
    if record["nonfinite"]:  # the record's own flags, read with its checksums: nothing
      names = record["nonfinite"]  # non-finite is ever written (no reader calls it damage)
      raise NonFiniteStateError(
        f"step {step} was not saved: {len(names)} array(s) of its "
        f"state are not finite ({', '.join(names[:3])})",
        names,
      )
    items[INTEGRITY] = ocp.args.JsonSave(record)
    # deferred(): a second signal's KeyboardInterrupt waits until the save
    # has started whole; the caller's close() then finishes it.
    with self._write_errors(), interrupts.deferred():  # the previous save's error surfaces here
      storage.within(
        self.deadline,
        f"saving checkpoint {step} in {self.directory}",
        lambda: self._manager.save(step, args=ocp.args.Composite(**items)),
      )

  def restore(
    self,
    step: int,
    abstract_state: Any,
    abstract_memory: Any = None,
    identity: Optional[dict[str, Any]] = None,
    accept: tuple[str, ...] = (),
  ) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """Returns (state, memory or None, data_state) of `step`, verified.

    `abstract_*` give the structure, shapes, dtypes (and shardings) to restore
    into; pass `abstract_memory=None` to skip the memory (evaluation).
    `identity` (`run_identity` of the restoring run; parts may be left out)
    is compared with the one saved; a difference in a part named in
    `accept` is logged instead of raised.

    Raises MissingStepError (no such step), ShapeMismatchError (the config's
    model is not the checkpoint's), RunMismatchError (another model config,
    tokenizer or corpus) or DamagedCheckpointError.
    """
    where = self.step_dir(step)
    if step not in self.all_steps():
      self.reload()
      if step not in self.all_steps():
        raise MissingStepError(
          f"no checkpoint of step {step} in {self.directory}; saved steps are "
          f"{self.all_steps() or 'none'}"
        )
    self._check_shapes(step, abstract_state)
    error = None
    for delay in (0.0,) + READ_RETRY_DELAYS:
      time.sleep(delay)
      try:
        record, restored, items = self._read(step, abstract_state, abstract_memory)
        break
      except Exception as e:  # Orbax / TensorStore raise many kinds on bad files
        # A trainer rotating the step away deletes its files one by one:
        # what is read meanwhile fails like damage. Only a step that is
        # still there, and fails each time, is damaged.
        self._raise_if_gone(step)
        error = e
    else:
      assert error is not None  # every attempt failed, and there is at least one
      raise DamagedCheckpointError(
        f"checkpoint {where} is damaged {_cause(error)}; {self.advice}"
      ) from None
    integrity.verify(where, record, restored, "memory" in items, identity, accept, self.advice)
    data_state = {k: np.asarray(v, np.int64) for k, v in restored["data"].items()}
    memory = None
    if abstract_memory is not None:
      memory = trees.with_empty_fields(abstract_memory, restored.get("memory") or {})
    return restored["state"], memory, data_state

  def record(self, step: int) -> dict[str, Any]:
    """The integrity record of `step`, as stored (nothing verified), read
    as every JSON file a run holds is (savedjson): DamagedJSONError when it
    cannot be parsed, an OSError when it cannot be opened."""
    return savedjson.read(os.path.join(self.step_dir(step), INTEGRITY, INTEGRITY_FILE))

  def _read(
    self, step: int, abstract_state: Any, abstract_memory: Any
  ) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """(integrity record, restored items, items asked for) of `step`, as
    stored: nothing verified yet."""
    items = dict(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
    # The integrity record first: it also names the memory fields saved. A
    # checkpoint of an older version may lack a field the memory has since
    # gained (e.g. `visits`), which then starts empty, as in a fresh memory.
    record = self.record(step)
    if abstract_memory is not None:
      sums = record.get("sums") if isinstance(record, dict) else None
      saved = {
        name.split("/")[1]
        for name in (sums if isinstance(sums, dict) else {})
        if isinstance(name, str) and name.startswith("memory/")
      }
      wanted = {k: v for k, v in trees.nonempty_fields(abstract_memory).items() if k in saved}
      if wanted:
        items["memory"] = ocp.args.StandardRestore(wanted)
    return record, self._manager.restore(step, args=ocp.args.Composite(**items)), items

  def _raise_if_gone(self, step: int) -> None:
    """MissingStepError if `step` was deleted while it was read."""
    if self._gone(step):
      raise MissingStepError(
        f"checkpoint {self.step_dir(step)} was deleted while it was read "
        "(a running trainer rotated it away)"
      ) from None

  def _gone(self, step: int) -> bool:
    """Whether `step` has been deleted (or is being deleted) since it was listed."""
    if not remote.isdir(self.step_dir(step)):
      return True
    self.reload()
    return step not in self.all_steps()

  def _check_shapes(self, step: int, abstract_state: Any) -> None:
    """ShapeMismatchError naming the parameters whose saved shapes differ;
    MissingStepError if the step vanishes meanwhile (metadata read while
    rotation deletes the step can lack arrays it has)."""
    message = self._shape_mismatch(step, abstract_state)
    for delay in READ_RETRY_DELAYS:
      if message is None:
        return
      self._raise_if_gone(step)
      time.sleep(delay)
      message = self._shape_mismatch(step, abstract_state)
    if message is not None:
      raise ShapeMismatchError(message)

  def _shape_mismatch(self, step: int, abstract_state: Any) -> Optional[str]:
    """What differs between the saved and the wanted parameter shapes, or
    None (also when the metadata cannot be read: that is damage, which the
    restore finds)."""
    try:
      saved = self._manager.item_metadata(step)["state"]
      saved = trees.param_shapes(getattr(saved, "tree", saved))
    except Exception:
      return None
    wanted = trees.param_shapes(abstract_state)
    diffs = [
      f"{name} {saved[name]} -> {wanted[name]}"
      for name in wanted
      if name in saved and saved[name] != wanted[name]
    ]
    missing = [name for name in wanted if name not in saved]
    extra = [name for name in saved if name not in wanted]
    if not (diffs or missing or extra):
      return None
    parts = []
    if diffs:
      parts.append(
        f"{len(diffs)} of {len(wanted)} have other shapes, saved -> config: "
        + "; ".join(diffs[:3])
        + ("; ..." if len(diffs) > 3 else "")
      )
    if missing:
      parts.append(
        f"not in the checkpoint: {', '.join(missing[:3])}" + (", ..." if len(missing) > 3 else "")
      )
    if extra:
      parts.append(
        f"only in the checkpoint: {', '.join(extra[:3])}" + (", ..." if len(extra) > 3 else "")
      )
    return (
      f"parameter shapes differ between checkpoint {self.step_dir(step)} and the "
      f"config's model ({'; '.join(parts)}): the config is not the one that trained it; "
      "use the saved config (config.json) or another --workdir"
    )

  def skipped_steps(self) -> list:
    """The steps in checkpoints/skipped/ (moved aside by --restore_intact),
    newest first: ints, and names such as '6.1' for a step skipped twice."""
    try:
      names = remote.listdir(self.skipped)
    except FileNotFoundError:
      return []
    steps = [int(n) if n.isdigit() else n for n in names]
    return sorted(
      steps, key=lambda n: [int(p) for p in str(n).split(".") if p.isdigit()], reverse=True
    )

  def move_aside(self, step: int) -> str:
    """Moves a damaged step into checkpoints/skipped/ (where rotation never
    deletes it and restores never look); returns its new path."""
    target = os.path.join(self.skipped, str(step))
    n = 1
    while remote.exists(target):
      target = os.path.join(self.skipped, f"{step}.{n}")
      n += 1
    if remote.is_remote(target):  # Cloud Storage renames nothing: copied, then removed
      remote.move(self.step_dir(step), target)
    else:
      os.makedirs(self.skipped, exist_ok=True)
      os.replace(self.step_dir(step), target)
    self.reload()
    return target

  def wait(self) -> None:
    with self._write_errors():
      storage.within(
        self.deadline, f"finishing the save in {self.directory}", self._manager.wait_until_finished
      )

  def close(self) -> None:
    if self.deadline is not None and storage.stalled():
      return  # the store stopped answering: nothing it holds can be finished or waited for
    error = None
    try:
      self.wait()
    except Exception as e:
      error = e
    try:
      if not storage.stalled():  # (Orbax may report the save's refused write only here)
        with self._write_errors():
          storage.within(self.deadline, f"closing {self.directory}", self._manager.close)
    except Exception:
      if error is None:  # else the same failure, already in hand
        raise
    if error is not None:
      raise error

  @contextlib.contextmanager
  def _write_errors(self) -> Iterator[None]:
    """A save that the disk refused (full, read-only, no permission) as one
    CheckpointWriteError; Orbax reports it from its background threads as
    a ValueError carrying the OS error code."""
    try:
      yield
    except Exception as e:
      code = write_errno(e)
      if code is None:
        raise
      saved = [s for s in self._manager.all_steps()]
      raise CheckpointWriteError(
        f"cannot save a checkpoint in {self.directory}: {os.strerror(code)}; the checkpoints "
        f"saved before are intact (steps {saved or 'none'})"
      ) from e
