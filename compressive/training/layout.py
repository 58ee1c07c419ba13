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
of its top-level files (compressive/remote.py): `opened(path)` gives the
`Workdir` of either, its `root` the local folder and its `mirror` the copy,
whose URL it carries. Its checkpoints and params/ are the bucket's:
`Workdir.checkpoints` and `Export.params` name them there, and `public`
names a local path by the URL, as what a user reads names what they gave.
A function that takes a run's place takes `Where`: a path, or the
`Workdir` a caller opened (`workdir(where)`, `export(where)`).

An export: config.json, export.json (its manifest), params/ (export.py);
written as `.compressive-export-partial-<pid>` beside its destination.
The evaluation and analysis results of an export are named as a workdir's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator, Optional, Self, Union

from compressive import files, remote, storage

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
class _Place:
  """A run's folder: `root`, on this machine, and, for one on Cloud Storage,
  the `mirror` that `root` is the local copy of (compressive/remote.py)."""

  root: str
  mirror: Optional[remote.Mirror] = dataclasses.field(default=None, compare=False, repr=False)

  @property
  def url(self) -> Optional[str]:
    """The URL the folder stands for, or None: a folder on this machine."""
    return self.mirror.url if self.mirror is not None else None

  @property
  def name(self) -> str:
    """The place as its user named it: the URL, or the root."""
    return self.url if self.url is not None else self.root

  @property
  def deadline(self) -> Optional[float]:
    """Seconds each storage call of the URL may go unanswered (the
    mirror's), or None: a folder on this machine."""
    return self.mirror.deadline if self.mirror is not None else None

  def absolute(self) -> Self:
    """The same place, its root absolute (a path named the same from any
    current directory)."""
    return dataclasses.replace(self, root=os.path.abspath(self.root))

  def _beside(self, name: str) -> str:
    """`name` in the run: in the URL for what stays in the bucket."""
    return f"{self.url}/{name}" if self.url is not None else os.path.join(self.root, name)

  def public(self, text: str) -> str:
    """`text` with the local folder named by the URL it stands for: what a
    user reads names what they gave."""
    return text.replace(self.root, self.url) if self.url is not None else text

  def push(self) -> None:
    """Copies what changed in the local copy to the URL (Mirror.push, one
    line if it cannot); nothing for a folder on this machine."""
    if self.mirror is not None:
      self.mirror.push_reporting()


@dataclasses.dataclass(frozen=True)
class Workdir(_Place):
  """The paths of a training workdir's files, under `root` as given (a
  caller that must name a file the same from any current directory passes
  an absolute root)."""

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
    """The checkpoints folder: the URL's for a workdir on Cloud Storage."""
    return self._beside(CHECKPOINT_DIR)

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
class Export(_Place):
  """The paths of an export's files, under `root`."""

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
    """The parameters' folder: the URL's for an export on Cloud Storage."""
    return self._beside(PARAMS_DIR)

  @staticmethod
  def partial(parent: str, pid: int) -> str:
    """The folder an export is written into, in its destination's `parent`,
    before it is renamed into place."""
    return os.path.join(parent, f"{PARTIAL_EXPORT_PREFIX}{pid}")


# A run's place as a function takes it: a path, or a Workdir a caller opened.
Where = Union[str, Workdir]


def workdir(where: Where) -> Workdir:
  """`where` as a Workdir: the one given, or the folder at that path."""
  return where if isinstance(where, Workdir) else Workdir(os.fspath(where))


def export(where: Where) -> Export:
  """The export at `where` (a path, or the place a caller opened)."""
  place = workdir(where)
  return Export(place.root, place.mirror)


@contextlib.contextmanager
def opened(path: str, deadline: Optional[float] = storage.DEFAULT_DEADLINE_S) -> Iterator[Workdir]:
  """The run (a workdir or an export) at `path`, as a Workdir, while the
  body works in it: a gs:// URL through a local mirror of its files
  (remote.Mirror, its storage calls each within `deadline` seconds), whose
  changes are copied back when the body ends; a path as it is."""
  if remote.is_remote(path):
    with remote.Mirror(path, deadline) as mirror:
      yield Workdir(mirror.local, mirror)
  else:
    yield Workdir(path)
