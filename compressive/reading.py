"""What the tools that read a trained run share (eval.py, sample.py,
analyze.py, export.py): one preamble, the saved config made ready, and the
run opened.

    with reading.tool(progress=True) as place:
      experiment = reading.flagged_experiment(place, split=FLAGS.split)
      ...  # the tool's own checks, its corpus
      run = reading.open_flagged_run(place, experiment)
      ...  # its result, written into `place`

`tool` is the preamble: the libraries quiet, a user's mistake one line and
exit code 2 (cli.user_errors), --plugin imported and nothing else imported
on the saved config's say-so (cli_flags.reading_saved_run), the tool's own flag
checks (each flag group checks its own ranges as it is parsed), --workdir
opened (layout.opened: a gs:// URL through a local mirror, copied back
when the body ends) and given to the body as a value, the multi-host
runtime joined where the tool has its flags, and progress lines on
stderr. `flagged_experiment` reads the workdir's (or export's) config.json,
applies the memory and mesh flags, checks it (config.check_saved) and
compares it with what the run recorded, all before any corpus is read or
model built. `open_flagged_run` restores the run onto that experiment
(compressive/training/opening.py), building nothing twice.

A tools-layer module (it reads the training layer); compressive/cli.py,
below every layer, holds what every entry point shares.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from absl import flags
import jax
import jax.numpy as jnp

from compressive import cli, cli_flags, errors, storage
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


@contextlib.contextmanager
def tool(
  validate: Optional[Callable[[], None]] = None, *, progress: bool = False
) -> Iterator[layout.Workdir]:
  """Runs a reading tool's work (the body), given the place --workdir
  names, opened: see the module's docstring. `validate`: the tool's own
  checks of its flags beyond their ranges (run first); `progress`: progress
  lines (logging INFO) on stderr, from process 0 only."""
  cli.quiet_libraries()
  try:
    with cli.user_errors(), cli_flags.reading_saved_run():
      if validate is not None:
        validate()
      with layout.opened(FLAGS.workdir, FLAGS.storage_deadline or None) as place:
        processes.join_as_flagged()
        if progress:
          logging.getLogger("compressive").setLevel(
            logging.INFO if jax.process_index() == 0 else logging.WARNING
          )
        yield place
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


def flagged_experiment(
  place: layout.Workdir,
  *,
  split: Optional[str] = None,
  sizes: Sequence[str] = MEMORY_FLAGS,
  step_must_exist: bool = False,
  check: Optional[Callable[[runconfig.SavedConfig], None]] = None,
) -> experiment_lib.Experiment:
  """The saved config of --workdir (a workdir or an export: `place`, as
  `tool` opened it) made ready and
  checked (config.check_saved): the evaluation sizes of the flags `sizes`
  (config.SIZE_FIELDS) and --mesh_shape applied, `split` set as eval.split;
  a note on stderr when the saved mesh is replaced. `check(config)`, the
  tool's own check of the saved config, runs first; with
  `step_must_exist`, a workdir without the checkpoint to read is refused
  (CheckpointError) before anything is loaded. Last, the config is compared
  with the identity the run recorded (model, data section, tokenizer): an
  edited config.json never chooses what is read."""
  config = runconfig.load_config(place)  # cheap: a missing workdir fails here
  if check is not None:
    check(config)
  if split is not None:
    config.eval.split = split
  experiment, note = config_lib.check_saved(
    config, sizes={name: FLAGS[name].value for name in sizes}, mesh_shape=FLAGS.mesh_shape
  )
  if note:
    print(note, file=sys.stderr)
  if step_must_exist:
    _check_step(place)
  export_lib.check_identity(place, experiment, FLAGS.step)
  return experiment


def open_flagged_run(
  place: layout.Workdir, experiment: experiment_lib.Experiment
) -> opening.OpenRun:
  """--workdir's checkpoint --step (default the newest: a trainer may rotate
  it away meanwhile, and the newest that exists is read), opened as
  `experiment` (flagged_experiment's)."""
  return opening.open_run(place, FLAGS.step, experiment=experiment)


def _check_step(place: layout.Workdir) -> None:
  """CheckpointError, before any loading, when the workdir has no checkpoint
  to read (an export holds one step, checked when it is loaded)."""
  if export_lib.is_export(place):
    return
  checkpointer = checkpoint.Checkpointer(place, read_only=True)
  saved = checkpointer.all_steps()
  checkpointer.close()
  step = FLAGS.step if FLAGS.step is not None else (saved[-1] if saved else None)
  if step is None:
    raise CheckpointError(f"no checkpoint in {FLAGS.workdir}: nothing to evaluate")
  if step not in saved:
    raise CheckpointError(
      f"--step={step}: no checkpoint of step {step} in {FLAGS.workdir}; "
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
