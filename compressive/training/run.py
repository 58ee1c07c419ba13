"""A run as its steps see it (`Run`), how its steps begin (`begin`: the
state restored or fresh, the jitted step, with the lines that say where and
how it steps), and what a step may end with besides stepping: a checkpoint
(`save`, when `save_due`) and an estimate of the evaluation metrics
(`estimate`, when `eval_due`).

The loop (loop.py) builds the Run once the run is known to go on, begins
it, steps it, and at a step's end calls these; held apart from the loop so
that the loop reads as the order of a step's work, and what each piece of
that work does and writes (the checkpoint with the data position and the
run's identity, the eval metrics, the lines that time them) is read in one
place.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import jax

from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive import values
from compressive.evaluation import evaluate as eval_lib
from compressive.model.transformer import merge_params
from compressive.training import checkpoint as ckpt_lib
from compressive.training import layout, runlog
from compressive.training import restore as restore_lib
from compressive.training import setup as setup_lib
from compressive.training import step as train_step
from compressive.training.metrics import MetricWriter

if TYPE_CHECKING:  # the training memory, named for the type checker only
  from compressive.model import memory as memory_lib

_log = logging.getLogger("compressive")


@dataclasses.dataclass
class Run:
  """What a run's steps use besides the state and memory (built by
  loop._train; the clock, metric log and window by `begin`, once the state
  is ready)."""

  experiment: experiment_lib.Experiment
  workdir: layout.Workdir
  checkpointer: ckpt_lib.Checkpointer
  setup: setup_lib.Setup
  identity: dict[str, Any]
  train_iter: data_lib.SegmentIterator
  eval_docs: Any
  writer: MetricWriter
  eval_writer: MetricWriter
  profiler: runlog.Profiler
  end: int
  accept_changed_corpus: bool = False
  clock: Optional[runlog.Clock] = None
  metric_log: Optional[runlog.MetricLog] = None
  window: Optional[runlog.MetricWindow] = None
  last_eval: dict[str, float] = dataclasses.field(default_factory=dict)


def begin(
  run: Run, start: int, restored: Optional[restore_lib.Restored], is_main: bool
) -> tuple[train_step.TrainState, memory_lib.Memory, jax.stages.Wrapped]:
  """(state, memory, the jitted step) a run's steps begin with, its clock,
  metric window and log made."""
  state, memory = restore_lib.start_state(
    run.experiment,
    run.setup,
    start,
    restored,
    run.train_iter,
    run.writer,
    is_main,
    run.workdir,
    run.accept_changed_corpus,
  )
  step_fn = _step_fn(run.experiment, run.setup, run.train_iter)
  run.clock, run.window = runlog.Clock(), runlog.MetricWindow()
  run.metric_log = runlog.MetricLog(run.experiment, run.writer, run.end)
  assert run.experiment.train.prefetch_steps is not None  # a config checked to train has it
  return state, memory, step_fn


def _step_fn(
  experiment: experiment_lib.Experiment,
  setup: setup_lib.Setup,
  train_iter: data_lib.SegmentIterator,
) -> jax.stages.Wrapped:
  """The jitted train step on the run's layout (its mesh and, if any, its
  gradient accumulation logged)."""
  layout = setup.layout
  device = layout.mesh.devices.flat[0]
  _log.info(
    "mesh %s over %d %s devices (%s) in %d processes, JAX %s; this process reads rows [%d, %d)",
    dict(layout.mesh.shape),
    layout.mesh.size,
    device.platform,
    device.device_kind,
    jax.process_count(),
    jax.__version__,
    train_iter.row_start,
    train_iter.row_start + train_iter.num_rows,
  )
  _log_how_it_steps(experiment, device.platform)
  train = experiment.train
  return train_step.make_train_step(
    setup.graphdef,
    setup.state_template,
    setup.tx,
    experiment.model.dropout_rate > 0,
    layout,
    grad_accum_steps=train.grad_accum_steps,
    gradient_window=train.gradient_window,
  )


def _log_how_it_steps(experiment: experiment_lib.Experiment, platform: str) -> None:
  """The lines after the mesh's: a warning for a config's accelerator
  precision on CPU devices (`platform`), and how the step updates when not
  once per segment's whole batch (a gradient window, micro-batches)."""
  if platform == "cpu" and experiment.model.dtype != "float32":
    _log.warning(
      "model.dtype=%s on CPU devices: a config meant for a GPU or TPU (a preset: "
      "gpu1, gpu8, tpu_v5e8), run here slowly and in another precision than there "
      "(--config.model.dtype=float32 to run it here in float32; JAX sees no "
      "accelerator: check its plugin with python -c 'import jax; print(jax.devices())')",
      experiment.model.dtype,
    )
  train = experiment.train
  if train.gradient_window > 1:
    _log.info(
      "one update per window of %d segments; the loss reaches back through the "
      "memory within it (model.memory_gradient=%s)",
      train.gradient_window,
      experiment.model.memory_gradient,
    )
  if train.grad_accum_steps > 1:
    _log.info(
      "accumulating gradients over %d micro-batches of %d rows",
      train.grad_accum_steps,
      train.micro_batch_rows,
    )


def save_due(train: experiment_lib.TrainConfig, step: int, end: int, stopping: bool) -> bool:
  """Whether `step` is checkpointed: on a stop, at the run's `end`, and every
  train.checkpoint_every_steps steps (0: never)."""
  every = train.checkpoint_every_steps
  return stopping or step == end or bool(every and step % every == 0)


def save(
  run: Run,
  step: int,
  state: train_step.TrainState,
  memory: memory_lib.Memory,
  data_state: dict[str, Any],
) -> Optional[list[str]]:
  """Checkpoints the step with `data_state`, the position after the batches
  consumed (not those prefetched), and the run's identity; training waits
  only until the save is under way. The names of the non-finite arrays
  when the save was refused for them (Checkpointer.save), else None."""
  t_save = time.time()
  try:
    run.checkpointer.save(
      step, state, memory, setup_lib.global_data_state(data_state, run.train_iter), run.identity
    )
  except ckpt_lib.NonFiniteStateError as e:
    return e.names
  assert run.clock is not None  # `begin` set it, before the first step
  if jax.process_index() == 0:  # a workdir on Cloud Storage: its side files copied there
    run.workdir.push()
  took = run.clock.exclude("save", t_save)
  _log.info(
    "checkpoint of step %d: training waited %.1f s (the rest is written in the background)",
    step,
    took,
  )
  return None


def eval_due(train: experiment_lib.TrainConfig, step: int) -> bool:
  """Whether `step` is evaluated: every train.eval_every_steps steps (0:
  never), and at the run's last step (num_train_steps)."""
  every = train.eval_every_steps
  return bool(every and step % every == 0) or step == train.num_train_steps


def estimate(
  run: Run, state: train_step.TrainState, step: int, stop: Optional[Callable[[], bool]] = None
) -> Optional[dict[str, float]]:
  """A quick estimate of the evaluation metrics, written to the eval metrics
  (eval.max_segments per row; <= 0 for the whole split): eval.py evaluates
  whole splits. None, nothing written, when `stop()` says so at a segment's
  boundary (a signal asked the run to stop: it is saved without waiting for
  the rest of the evaluation)."""
  experiment, setup = run.experiment, run.setup
  t_eval = time.time()
  model = merge_params(setup.graphdef, setup.state_template, state.params)
  result = eval_lib.evaluate(
    model,
    run.eval_docs,
    experiment,
    max_segments=experiment.eval.max_segments,
    mesh=setup.layout.mesh,
    stop=stop,
  )
  if result is None:
    _log.warning("the evaluation at step %d is dropped: a stop was asked for during it", step)
    return None
  run.eval_writer.write(step, result)
  assert run.clock is not None  # `begin` set it, before the first step
  took = run.clock.exclude("eval", t_eval)
  _log.info(
    "eval at step %d on %s: %s  (%.1f s)",
    step,
    experiment.eval.split,
    values.metrics_text(result),
    took,
  )
  return result
