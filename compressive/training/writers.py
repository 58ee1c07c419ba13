"""Metric writers: where a run's scalars go besides its own metrics files.

A run always writes its metrics as JSON lines (`metrics_<stream>.jsonl`,
metrics.MetricWriter: the record that its curve, resume and tools read),
and hands every record to the writers its config names in
`metric_writers` (default `("tensorboard",)`):

    tensorboard  TensorBoard event files in WORKDIR/tensorboard/<stream>/
                 (tensorboardX, no TensorFlow), the config as hparams
    wandb        a Weights & Biases run (`pip install "compressive[wandb]"`):
                 named after the workdir, the config as its config, each
                 record logged at its step as `<stream>/<name>`; W&B's own
                 variables (WANDB_PROJECT, WANDB_ENTITY, WANDB_NAME,
                 WANDB_MODE=offline, WANDB_RUN_ID, ...) are honoured

A writer of your own registers like a compression or a data source: a
factory taking a `Run` and returning an object with `write(stream, step,
scalars)`, `write_hparams(config)` and `close()` (`Writer`), registered by
name with `register(name, factory)` or named `module:Name` in
metric_writers (imported on demand, plugins.lookup). Only the process that
writes the metrics (process 0) opens writers. A writer that cannot be had
(an unknown name, a module that cannot be imported, wandb not installed) is
one line at the start of the run, before anything is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import os
import time
from typing import Any, Callable, Mapping, Protocol

from compressive import nested, plugins
from compressive.errors import ConfigError
from compressive.errors import naming as _naming
from compressive.training import layout

_writer_ids = itertools.count()
# The built-in writers' names (metric_writers).
TENSORBOARD, WANDB = "tensorboard", "wandb"


@dataclasses.dataclass(frozen=True)
class Run:
  """What a writer is told of the run it writes for."""

  workdir: str  # the run's folder on this machine (a mirror's, for gs://)
  url: str  # the workdir as the user named it (a gs:// URL, or the folder)
  name: str  # the run's name: the workdir's last part
  config: Mapping[str, Any]  # the config as the run understands it (Experiment.to_dict())


class Writer(Protocol):
  """What the run asks of a metric writer."""

  def write(self, stream: str, step: int, scalars: Mapping[str, float]) -> None:
    """One record of `stream` ("train" or "eval") at `step`."""

  def write_hparams(self, config: Mapping[str, Any]) -> None:
    """The run's config (nested), once per run start."""

  def close(self) -> None: ...


Factory = Callable[[Run], Writer]
_WRITERS: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> Factory:
  """Adds a writer by name; a second of the same name is an error."""
  if name in _WRITERS:
    raise ValueError(f"metric writer {name!r} is already registered")
  _WRITERS[name] = factory
  return factory


def unregister(name: str) -> None:
  """Removes a writer (tests that register one clean up with this)."""
  _WRITERS.pop(name, None)


def resolve(names: Any) -> list[Factory]:
  """The factories of `names` (metric_writers): registered names or
  `module:Name`; ConfigError, one line, for one that cannot be had."""
  if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
    raise ConfigError(
      f"metric_writers={names!r} must be a tuple of writer names, e.g. ('tensorboard', 'wandb')"
    )
  found = []
  for name in names:
    factory = plugins.lookup(
      "metric_writers",
      name,
      _WRITERS,
      callable,
      "a callable (a writer factory taking a compressive.training.writers.Run)",
    )
    if name == WANDB and importlib.util.find_spec(WANDB) is None:
      raise ConfigError(
        "metric_writers names wandb, which needs the wandb package: pip "
        'install "compressive[wandb]" (or pip install wandb)'
      )
    found.append(factory)
  return found


def open_all(names: Any, run: Run) -> list[Writer]:
  """The writers of `names` opened for `run` (resolve's checks first)."""
  return [factory(run) for factory in resolve(names)]


def run_of(workdir: layout.Where, config: Mapping[str, Any]) -> Run:
  """The Run of a workdir (a mirror's named by its URL)."""
  place = layout.workdir(workdir)
  url = place.url or os.path.abspath(place.root)
  return Run(
    workdir=place.root, url=url, name=os.path.basename(url.rstrip("/")) or "run", config=config
  )


# -- TensorBoard. ---------------------------------------------------------------


def hparams(config: Any) -> dict[str, bool | int | float | str]:
  """A config (nested, as written: Experiment.config, every field as the
  run's config.json records it, or already flat) as TensorBoard hparams:
  dotted keys (nested.flatten, the one flattener), values bool / int /
  float / str (hparam_value: tuples, lists, None and the rest as str)."""
  return {k: hparam_value(v) for k, v in nested.flatten(config).items()}


def hparam_value(v: Any) -> bool | int | float | str:
  """A config value as a TensorBoard hparam: bool, number or string (tuples,
  lists, None and anything else as their str())."""
  if hasattr(v, "item") and getattr(v, "ndim", None) == 0:  # numpy scalar
    v = v.item()
  if isinstance(v, (bool, int, float, str)):
    return v
  return str(v)


class TensorBoard:
  """Event files in WORKDIR/tensorboard/<stream>/ (layout.Workdir), with
  tensorboardX (protobuf and numpy only), never TensorFlow; the hparams in
  the train stream's folder (TensorBoard's HPARAMS tab: one row per run)."""

  def __init__(self, run: Run):
    self.run = layout.Workdir(run.workdir)
    self._events: dict[str, Any] = {}

  def _writer(self, stream: str) -> Any:  # tensorboardX's EventsWriter
    if stream not in self._events:
      # Created on first use, so that a stream that writes nothing leaves no
      # empty event file behind. Synchronous (tensorboardX's EventsWriter, not
      # its SummaryWriter's background thread): a write the disk refuses is
      # an OSError here, reported in one line, not a dead thread whose queue
      # a later flush would wait on forever. tensorboardX names event files
      # by the second and host only, and opens them with "wb": the suffix
      # keeps a second writer within that second (a quick resume) from
      # truncating the first's.
      from tensorboardX import event_file_writer

      os.makedirs(self.run.tensorboard(stream), exist_ok=True)
      self._events[stream] = event_file_writer.EventsWriter(
        self.run.events(stream), filename_suffix=f".{os.getpid()}.{next(_writer_ids)}"
      )
    return self._events[stream]

  def _summary(self, stream: str, summary: Any, step: int = 0) -> None:
    from tensorboardX.proto import event_pb2

    writer = self._writer(stream)
    with _naming(self.run.tensorboard(stream)):
      writer.write_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
      writer.flush()

  def write(self, stream: str, step: int, scalars: Mapping[str, float]) -> None:
    from tensorboardX import summary as tbx_summary
    from tensorboardX.proto import summary_pb2

    summaries = [v for k, x in scalars.items() for v in tbx_summary.scalar(k, float(x)).value]
    self._summary(stream, summary_pb2.Summary(value=summaries), int(step))

  def write_hparams(self, config: Mapping[str, Any]) -> None:
    """The config as TensorBoard hparams (`hparams`: flat, bool /
    number / str). Only the session start info: without an experiment
    summary TensorBoard infers the hparams and metrics of every run it
    sees, which compares runs with different configs correctly. No session
    end info: close() cannot tell a finished run from a failed one.
    TensorBoard shows the first record of a folder: a resumed run's is
    ignored."""
    from tensorboardX import summary as tbx_summary

    _, session_start, _ = tbx_summary.hparams(hparams(config), {})
    self._summary("train", session_start)

  def close(self) -> None:
    for writer in self._events.values():
      writer.close()
    self._events = {}


# -- Weights & Biases. ------------------------------------------------------------


class WandB:
  """A Weights & Biases run for the workdir: its files in WORKDIR/wandb/,
  its id a digest of the workdir's URL (WANDB_RUN_ID chooses another), so a
  resumed run continues the same W&B run (resume="allow"); its name the
  workdir's last part unless WANDB_NAME is set; its project WANDB_PROJECT,
  else "compressive"; its config the run's. WANDB_MODE=offline (or
  `wandb offline`) keeps it on this machine, for `wandb sync` later."""

  def __init__(self, run: Run):
    import wandb

    folder = layout.Workdir(run.workdir).wandb
    os.makedirs(folder, exist_ok=True)
    run_id = os.environ.get("WANDB_RUN_ID") or hashlib.sha256(run.url.encode()).hexdigest()[:16]
    self._run = wandb.init(
      project=os.environ.get("WANDB_PROJECT") or "compressive",
      name=os.environ.get("WANDB_NAME") or run.name,
      id=run_id,
      resume="allow",
      dir=os.path.dirname(folder),
      config=dict(run.config),
      reinit="create_new",
    )

  def write(self, stream: str, step: int, scalars: Mapping[str, float]) -> None:
    self._run.log({f"{stream}/{k}": float(v) for k, v in scalars.items()}, step=int(step))

  def write_hparams(self, config: Mapping[str, Any]) -> None:
    self._run.config.update(dict(config), allow_val_change=True)

  def close(self) -> None:
    self._run.finish()


register(TENSORBOARD, TensorBoard)
register(WANDB, WandB)
