"""What the tools that read a trained run share (eval.py, sample.py,
analyze.py, export.py): the arguments that say how a run is read
(`Reading`, from the flags they share), the command line's preamble, the
saved config made ready, and the run opened.

    def run(args: Args) -> ...:  # the tool, a function of its arguments
      with reading.opened(args.reading) as place:
        experiment = reading.experiment_of(place, args.reading, split=args.split)
        ...  # the tool's own checks, its corpus
        run = reading.open_run(place, args.reading, experiment)
        ...  # its result, written into `place`

    def main(argv):  # the command: its flags parsed into Args, then run
      with reading.command(progress=True):
        result = run(Args.from_flags())
      ...  # printed

`command` is the command line's preamble: the libraries quiet, a user's
mistake one line and exit code 2 (cli.user_errors), the tool's own flag
checks (each flag group checks its own ranges as it is parsed), the
multi-host runtime joined where the tool has its flags, and progress lines
on stderr. `opened` is what a reading runs in: its --plugin modules
imported and nothing else imported on the saved config's say-so
(plugins.saved_config), and the workdir opened (layout.opened: a gs://
URL through a local mirror, copied back when the body ends) and given to
the body as a value. `experiment_of` reads the workdir's (or export's)
config.json, applies the memory sizes and the mesh, checks it
(config.check_saved) and compares it with what the run recorded, all
before any corpus is read or model built. `open_run` restores the run onto
that experiment (compressive/training/opening.py), building nothing twice.

A tools-layer module (it reads the training layer); compressive/cli.py,
below every layer, holds what every entry point shares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence

from absl import flags
import jax
import jax.numpy as jnp

from compressive import cli, errors, plugins, storage
from compressive import config as config_lib
from compressive import experiment as experiment_lib
from compressive.errors import CheckpointError
from compressive.model.sampling import Sampler
from compressive.scale import processes
from compressive.training import checkpoint, layout, opening, runconfig
from compressive.training import export as export_lib

if TYPE_CHECKING:  # the sampler's model, named for the type checker only
  from compressive.model.transformer import CompressiveTransformer

FLAGS = flags.FLAGS

MEMORY_FLAGS = ("memory_length", "compressed_memory_length")


@dataclasses.dataclass(frozen=True)
class Reading:
  """How a reading tool reads a run: the arguments of the flags they share
  (cli_flags.define_workdir_flags, define_memory_flags)."""

  workdir: str  # a training workdir or an export: a folder, or a gs:// URL
  step: Optional[int] = None  # the checkpoint to read; None: the newest
  # Evaluation sizes given (config.SIZE_FIELDS' names); None or absent: the run's.
  sizes: Mapping[str, Optional[int]] = dataclasses.field(default_factory=dict)
  mesh_shape: Optional[Sequence[str]] = None  # --mesh_shape's entries; None: the saved mesh
  storage_deadline: Optional[float] = storage.DEFAULT_DEADLINE_S  # None: no deadline
  plugins: tuple[str, ...] = ()  # --plugin: modules the saved config may name

  @classmethod
  def from_flags(cls, sizes: Sequence[str] = MEMORY_FLAGS) -> Reading:
    """The Reading of this process's command line: its --workdir, --step,
    --plugin, --storage_deadline and, of a tool with them, the memory flags
    named `sizes` and --mesh_shape."""
    return cls(
      workdir=FLAGS.workdir,
      step=FLAGS.step,
      sizes={name: FLAGS[name].value for name in sizes if name in FLAGS},
      mesh_shape=FLAGS.mesh_shape if "mesh_shape" in FLAGS else None,
      storage_deadline=FLAGS.storage_deadline or None,
      plugins=tuple(FLAGS.plugin or ()),
    )


@contextlib.contextmanager
def command(
  validate: Optional[Callable[[], None]] = None, *, progress: bool = False
) -> Iterator[None]:
  """A reading tool's command (the body: its flags parsed, its `run`
  called): see the module's docstring. `validate`: the tool's own checks
  of its flags beyond their ranges (run first); `progress`: progress lines
  (logging INFO) on stderr, from process 0 only."""
  cli.quiet_libraries()
  try:
    with cli.user_errors():
      if validate is not None:
        validate()
      processes.join_as_flagged()
      if progress:
        logging.getLogger("compressive").setLevel(
          logging.INFO if jax.process_index() == 0 else logging.WARNING
        )
      yield
  finally:  # stopped or failed while joining the others: no wait for them at exit
    if processes.join_unfinished():
      error = sys.exc_info()[1]
      if isinstance(error, errors.Stopped):  # reported here: nothing after this runs
        print(f"error: stopped by {signal.Signals(error.signum).name}", file=sys.stderr)
      storage.exit_now(
        error.code
        if isinstance(error, SystemExit)
        else errors.exit_status(error.signum)
        if isinstance(error, errors.Stopped)
        else 1
      )


@contextlib.contextmanager
def opened(reading: Reading) -> Iterator[layout.Workdir]:
  """The run `reading` names, opened (see the module's docstring), while
  the body reads it and writes its results there."""
  plugins.trust(reading.plugins)
  with plugins.saved_config(), layout.opened(reading.workdir, reading.storage_deadline) as place:
    yield place


def experiment_of(
  place: layout.Workdir,
  reading: Reading,
  *,
  split: Optional[str] = None,
  step_must_exist: bool = False,
  check: Optional[Callable[[runconfig.SavedConfig], None]] = None,
) -> experiment_lib.Experiment:
  """The saved config of the run at `place` (a workdir or an export, as
  `opened` gave it) made ready and checked (config.check_saved): the
  evaluation sizes and the mesh of `reading` applied, `split` set as
  eval.split; a note on stderr when the saved mesh is replaced.
  `check(config)`, the tool's own check of the saved config, runs first;
  with `step_must_exist`, a workdir without the checkpoint to read is
  refused (CheckpointError) before anything is loaded. Last, the config is
  compared with the identity the run recorded (model, data section,
  tokenizer): an edited config.json never chooses what is read."""
  config = runconfig.load_config(place)  # cheap: a missing workdir fails here
  if check is not None:
    check(config)
  if split is not None:
    config.eval.split = split
  experiment, note = config_lib.check_saved(
    config, sizes=dict(reading.sizes), mesh_shape=reading.mesh_shape
  )
  if note:
    print(note, file=sys.stderr)
  if step_must_exist:
    _check_step(place, reading)
  export_lib.check_identity(place, experiment, reading.step)
  return experiment


def open_run(
  place: layout.Workdir, reading: Reading, experiment: experiment_lib.Experiment
) -> opening.OpenRun:
  """The checkpoint `reading.step` of the run at `place` (default the
  newest: a trainer may rotate it away meanwhile, and the newest that
  exists is read), opened as `experiment` (experiment_of's)."""
  return opening.open_run(place, reading.step, experiment=experiment)


def _check_step(place: layout.Workdir, reading: Reading) -> None:
  """CheckpointError, before any loading, when the workdir has no checkpoint
  to read (an export holds one step, checked when it is loaded)."""
  if export_lib.is_export(place):
    return
  checkpointer = checkpoint.Checkpointer(place, read_only=True)
  saved = checkpointer.all_steps()
  checkpointer.close()
  step = reading.step if reading.step is not None else (saved[-1] if saved else None)
  if step is None:
    raise CheckpointError(f"no checkpoint in {reading.workdir}: nothing to evaluate")
  if step not in saved:
    raise CheckpointError(
      f"--step={step}: no checkpoint of step {step} in {reading.workdir}; "
      f"saved steps are {', '.join(map(str, saved))}"
    )


@functools.partial(jax.jit, static_argnums=1)
def _held_to(logits: jax.Array, pieces: int) -> jax.Array:
  """logits [B, V] with every id from `pieces` on at -inf: never chosen."""
  return jnp.where(jnp.arange(logits.shape[-1]) < pieces, logits, -jnp.inf)


class PiecesSampler(Sampler):
  """A Sampler that chooses among the first `pieces` ids only (the
  tokenizer's vocabulary), whatever the model's vocabulary: every logits it
  is given past them (a model.vocab_size larger than the tokenizer's) is
  set to -inf as it arrives, so greedy decoding, top-k and top-p alike
  never pick them."""

  def __init__(self, model: CompressiveTransformer, *, pieces: int, **sizes: int) -> None:
    self._pieces = pieces
    self._logits: Optional[jax.Array] = None
    super().__init__(model, **sizes)

  @property
  def logits(self) -> Any:  # [B, V] or None; Any: Sampler's attribute is typed None
    return self._logits

  @logits.setter
  def logits(self, value: Optional[jax.Array]) -> None:
    held = value is not None and value.shape[-1] > self._pieces
    self._logits = _held_to(value, self._pieces) if held else value
