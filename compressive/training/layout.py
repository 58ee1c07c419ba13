"""Where a run's files are: every name that a training workdir and an export
hold on disk, spelled here and nowhere else.

The names never change: a workdir or an export written by any version is
found, resumed and read by these same names. The modules that write or
read a run's files (the lock, the side files, the run config and log, the
metrics, the restore, the loop, the export and the tools) take the paths
from `Workdir` and `Export`, so one place answers what a run folder holds;
tests/training/test_layout.py fails when another module spells a name.

A training workdir:

  config.json              the run's config (runconfig.py)
  train.lock               the lock's record: its holder's PID and host (lock.py)
  train.log                the log (runlog.py)
  metrics_<name>.jsonl     the metrics of each stream of METRICS (metrics.py)
  tensorboard/<name>/      the same as TensorBoard event files (events.*)
  profile/                 the --profile_steps trace (JAX's layout inside it)
  checkpoints/             Orbax's step folders (checkpoint.py); skipped/, the
                           damaged steps moved aside; workdir.json, the
                           workdir whose run they hold (lock.py)
  curves.png               the training curve, drawn at the end of a run (curves.py)
  wandb/                   Weights & Biases' files, with metric_writers naming wandb
                           (writers.py; W&B's own layout inside it)
  eval_<split>_step<N>.json                  eval.py's result
  analysis_<name>_<split><sizes>.{json,png}  analyze.py's result and figure

and, when something was in a file's place, what was set aside: a side
file's `NAME.aside[.N]`, the lock record's `train.lock.set-aside-N`, an
unreadable `config.json.damaged`.

A workdir or an export on Cloud Storage is worked in through a local copy
of its top-level files (compressive/remote.py), whose checkpoints and
params/ are the bucket's: `Workdir.checkpoints` and `Export.params` name
them there.

An export: config.json, export.json (its manifest), params/ (export.py);
written as `.compressive-export-partial-<pid>` beside its destination.
The evaluation and analysis results of an export are named as a workdir's.
"""

from __future__ import annotations

import dataclasses
import os

from compressive import files, remote

CONFIG_FILE = "config.json"
LOCK_FILE = "train.lock"
LOG_FILE = "train.log"
CHECKPOINT_DIR = "checkpoints"
OWNER_FILE = "workdir.json"
SKIPPED_DIR = "skipped"
TENSORBOARD_DIR = "tensorboard"
PROFILE_DIR = "profile"
CURVES_FILE = "curves.png"
WANDB_DIR = "wandb"
# The metric streams a trainer writes: training's, and the evaluation's
# every eval_every_steps.
METRICS = ("train", "eval")
EXPORT_FILE = "export.json"
PARAMS_DIR = "params"
PARTIAL_EXPORT_PREFIX = ".compressive-export-partial-"


def metrics_file(name: str) -> str:
  return f"metrics_{name}.jsonl"


# The side files and folders (sidefiles.py), relative to the workdir: what
# the trainer writes beside the checkpoints, and checks before it writes;
# each folder after the one holding it.
SIDE_FILES = (CONFIG_FILE, LOG_FILE) + tuple(metrics_file(name) for name in METRICS)
SIDE_FOLDERS = (TENSORBOARD_DIR,) + tuple(os.path.join(TENSORBOARD_DIR, name) for name in METRICS)


def set_aside_lock(n: int | str) -> str:
  """The name, relative to the workdir, that the N-th thing found in the
  lock record's place is renamed to (lock.py works relative to the folder,
  never through a path); `n` "*" is the pattern of them all."""
  return f"{LOCK_FILE}.set-aside-{n}"


def aside(path: str, n: int = 0) -> str:
  """Where something in the side file `path`'s place is set aside: the
  first free of `path.aside`, `path.aside.1`, ..."""
  return f"{path}.aside" + (f".{n}" if n else "")


def damaged(path: str) -> str:
  """Where an unreadable config.json is set aside."""
  return f"{path}.damaged"


@dataclasses.dataclass(frozen=True)
class Workdir:
  """The paths of a training workdir's files, under `root` as given (a
  caller that must name a file the same from any current directory passes
  an absolute root)."""

  root: str

  def __post_init__(self) -> None:
    files.check_local(self.root, "a workdir")

  def _path(self, *names: str) -> str:
    return os.path.join(self.root, *names)

  @property
  def config(self) -> str:
    return self._path(CONFIG_FILE)

  @property
  def lock(self) -> str:
    return self._path(LOCK_FILE)

  @property
  def log(self) -> str:
    return self._path(LOG_FILE)

  @property
  def checkpoints(self) -> str:
    """The checkpoints folder: the URL's when `root` is the local mirror of
    a workdir on Cloud Storage (compressive/remote.py)."""
    return remote.beside(self.root, CHECKPOINT_DIR)

  @property
  def owner(self) -> str:
    """The checkpoints folder's record of the workdir whose run it holds."""
    return os.path.join(self.checkpoints, OWNER_FILE)

  @property
  def skipped(self) -> str:
    return os.path.join(self.checkpoints, SKIPPED_DIR)

  def metrics(self, name: str) -> str:
    return self._path(metrics_file(name))

  def tensorboard(self, name: str = "") -> str:
    """TensorBoard's folder (`tensorboard --logdir` of the run), or the
    stream `name`'s folder in it."""
    return self._path(TENSORBOARD_DIR, name) if name else self._path(TENSORBOARD_DIR)

  def events(self, name: str) -> str:
    """The prefix of the stream `name`'s event files (tensorboardX adds
    `.out.tfevents.<time>.<host><suffix>`)."""
    return os.path.join(self.tensorboard(name), "events")

  @property
  def profile(self) -> str:
    return self._path(PROFILE_DIR)

  @property
  def curves(self) -> str:
    return self._path(CURVES_FILE)

  @property
  def wandb(self) -> str:
    """W&B's folder (it writes its own `wandb/` inside the folder it is
    given: this folder's parent, the workdir)."""
    return self._path(WANDB_DIR)

  @property
  def side_files(self) -> tuple[str, ...]:
    return tuple(self._path(name) for name in SIDE_FILES)

  @property
  def side_folders(self) -> tuple[str, ...]:
    return tuple(self._path(name) for name in SIDE_FOLDERS)

  def eval_result(self, split: str, step: int) -> str:
    return self._path(f"eval_{split}_step{step}.json")

  def analysis_result(self, analysis: str, split: str, sizes: str, extension: str) -> str:
    """analyze.py's result (`extension` "json") or figure ("png"); `sizes`
    names the evaluation memory sizes given on its command line."""
    return self._path(f"analysis_{analysis}_{split}{sizes}.{extension}")


@dataclasses.dataclass(frozen=True)
class Export:
  """The paths of an export's files, under `root`."""

  root: str

  def __post_init__(self) -> None:
    files.check_local(self.root, "an export")

  @property
  def config(self) -> str:
    return os.path.join(self.root, CONFIG_FILE)

  @property
  def manifest(self) -> str:
    return os.path.join(self.root, EXPORT_FILE)

  @property
  def params(self) -> str:
    """The parameters' folder: the URL's when `root` is the local mirror of
    an export on Cloud Storage (compressive/remote.py)."""
    return remote.beside(self.root, PARAMS_DIR)

  @staticmethod
  def partial(parent: str, pid: int) -> str:
    """The folder an export is written into, in its destination's `parent`,
    before it is renamed into place."""
    return os.path.join(parent, f"{PARTIAL_EXPORT_PREFIX}{pid}")
