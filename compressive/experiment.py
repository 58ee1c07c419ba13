"""The checked experiment: typed, frozen config groups, built once by `config.check`.

An experiment config is a ConfigDict (configs/*.py) while it is written and
overridden on the command line; `config.check` reads it once into an
`Experiment`, whose groups are all that the layers below the entry points
take, and all that is recorded:

    experiment.model   ModelConfig   (compressive/model/config.py)
    experiment.train   TrainConfig   batch, steps, accumulation, cadences,
                                     prefetch, seed, optimizer (OptimizerConfig)
    experiment.eval    EvalConfig    evaluation's sizes (resolved), split, max_segments
    experiment.mesh    MeshConfig    (compressive/scale/sharding.py)
    experiment.data    DataConfig    (compressive/data/config.py: the shared
                                     fields, and each source's section as
                                     its schema declares it)

Each group checks itself when it is made (`__post_init__`): a field's range
is declared on the field (`whole`, `real`: values.integer and values.number,
float32-aware), and the rules between a group's own fields follow; `check`
keeps only the rules that span groups or ask the machine. `from_dict` reads a
group from its section of a config (a field it does not know is an error, a
field it lacks takes the default), copying each value as the config holds it
(no conversion), so a run computes exactly what its config says (the
helpers are values.py's, which the mesh's and the data's groups take too).
`Experiment.to_dict()` is the config as the run understood it: what a
workdir's config.json, a checkpoint's identity and the logged hyperparameters
record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flax import nnx

from compressive import values
from compressive.data import config as data_config
from compressive.data import registry
from compressive.data.config import DataConfig
from compressive.errors import ConfigError
from compressive.model.config import ModelConfig
from compressive.scale.sharding import MeshConfig

_INT32 = "[1, 2**31)"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """`config.optimizer`: Adam(W) with warmup and cosine decay (training/step.py).
  Each number is checked as the optimizer's float32 holds it."""

  name: str = values.text("adamw", ("adam", "adamw"))
  learning_rate: float = values.real(2e-3, "(0, inf)", "a finite number > 0")  # the peak
  warmup_steps: int = values.whole(30, "[0, 2**31)", "an integer >= 0, below 2**31")  # train steps
  # the decay's end, as a fraction of the peak
  final_lr_fraction: float = values.real(0.05, "[0, 1]", "in [0, 1] (a fraction of the peak)")
  b1: float = values.real(0.9, "[0, 1)", "in [0, 1)")
  b2: float = values.real(0.98, "[0, 1)", "in [0, 1)")
  eps: float = values.real(1e-9, "(0, inf)", "a finite number > 0")
  weight_decay: float = values.real(0.0, "[0, inf)", "a finite number >= 0")  # adamw's
  grad_clip_norm: float = values.real(0.5, "(0, inf]", "> 0 (inf: no clipping)")

  def __post_init__(self) -> None:
    held = values.check_fields(self, "optimizer.")
    # The products the update computes: the decayed rate, the decay term's rate.
    for other, what in (
      ("final_lr_fraction", "the final learning rate"),
      ("weight_decay", "the weight decay's rate"),
    ):
      if held[other]:
        product = float(f"{held['learning_rate'] * held[other]:.6g}")
        values.number(
          f"optimizer.learning_rate x optimizer.{other}",
          product,
          "(0, inf)",
          must=f"a finite number > 0 ({what})",
        )


def _writer_names_problem(names: tuple) -> str:
  """What is wrong with metric_writers' names (values.sequence's rule)."""
  if all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names):
    return ""
  return (
    f"={names!r} must be a tuple of distinct writer names, e.g. ('tensorboard', 'wandb'), "
    "or () for none"
  )


_POSITIVE = "a positive integer below 2**31"
_NEVER = "an integer >= 0 (0: never), below 2**31"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Training's fields of the config (its top level and `optimizer`).

  `segment_length` is the model's (model.segment_length), here for the
  derived sizes (`TrainConfig.from_dict(top, segment_length)`; not a field of the
  config's top level).
  """

  # The model's PRNG key holds 32 bits (2**32 would be seed 0 again), and
  # dropout's key is seed + 1.
  seed: int = values.whole(0, "[0, 2**32 - 1)")
  batch_size: int = values.whole(16, _INT32, _POSITIVE)  # global rows per step
  num_train_steps: int = values.whole(260, _INT32, _POSITIVE)
  segments_per_step: int = values.whole(4, _INT32, _POSITIVE)  # consecutive segments per step
  # Micro-batches per segment's update, each of batch_size / grad_accum_steps
  # rows (with its rows' memory), summed into one update: the same update
  # with less activation memory.
  grad_accum_steps: int = values.whole(1, _INT32, "a positive integer (1: no accumulation)")
  # Segments per update, the loss reaching back through the memory within
  # the window as model.memory_gradient allows (docs/DESIGN.md
  # §Task-taught compression); 1: one update per segment, the paper's.
  gradient_window: int = values.whole(
    1, _INT32, "a positive integer (segments per update; 1: one update per segment, the paper's)"
  )
  log_every_steps: int = values.whole(25, _INT32, _POSITIVE)
  # A quick estimate on eval.max_segments rows; 0: never (but at the end).
  eval_every_steps: int = values.whole(100, "[0, 2**31)", _NEVER)
  # 0: never (but at the end and on a stop).
  checkpoint_every_steps: int = values.whole(100, "[0, 2**31)", _NEVER)
  keep_checkpoints: int = values.whole(3, _INT32, _POSITIVE)
  # Steps' batches made ahead in a background thread (tokenized, stacked and
  # transferred to the devices) while the device computes; 0: none.
  prefetch_steps: int = values.whole(
    2,
    "[0, 64]",
    "an integer in [0, 64] (steps' batches made ahead in a background thread; 0: none)",
  )
  # Where the metrics go besides metrics_*.jsonl: writers by name
  # (training/writers.py: tensorboard, wandb) or module:Name, a user's own.
  metric_writers: tuple = values.sequence(("tensorboard",), rule=_writer_names_problem)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  segment_length: int = dataclasses.field(default=0, metadata={"derived": True})

  def __post_init__(self) -> None:
    values.check_fields(self, "")
    updates = self.num_train_steps * self.segments_per_step
    if updates > 2**31 - 1:
      raise ConfigError(
        f"num_train_steps x segments_per_step = {self.num_train_steps} x "
        f"{self.segments_per_step} = {updates} optimizer updates; the update counter is a "
        "32-bit integer: make it below 2**31"
      )
    window, accum = self.gradient_window, self.grad_accum_steps
    if self.segments_per_step % window:
      raise ConfigError(
        f"segments_per_step={self.segments_per_step} is not a multiple of "
        f"gradient_window={window}: a step makes one update per whole window"
      )
    if window > 1 and accum > 1:
      raise ConfigError(
        f"gradient_window={window} with grad_accum_steps={accum}: a window's "
        "gradient is not accumulated over micro-batches; set one of them to 1"
      )
    if self.batch_size % accum:
      raise ConfigError(
        f"batch_size={self.batch_size} is not divisible by "
        f"grad_accum_steps={accum}: each micro-batch takes batch_size / "
        "grad_accum_steps rows"
      )

  @classmethod
  def from_dict(cls, top: Mapping[str, Any], segment_length: int) -> "TrainConfig":
    """From a config's top level (its fields, and the optimizer section;
    the other sections are other groups')."""
    fields = {k: v for k, v in top.items() if k not in OTHER_SECTIONS}
    if "optimizer" in fields:
      fields["optimizer"] = values.from_dict(OptimizerConfig, fields["optimizer"], "optimizer.")
    return values.from_dict(cls, fields, "", segment_length=segment_length)

  @property
  def micro_batch_rows(self) -> int:
    """Rows per micro-batch: batch_size / grad_accum_steps (divisible: checked)."""
    return self.batch_size // self.grad_accum_steps

  @property
  def tokens_per_step(self) -> int:
    """Tokens a step reads: segments_per_step x batch_size x segment_length."""
    return self.segments_per_step * self.batch_size * self.segment_length

  @property
  def updates_per_step(self) -> int:
    """Optimizer updates per step: one per window of gradient_window
    segments (the paper's: one per segment)."""
    return self.segments_per_step // self.gradient_window

  @property
  def num_updates(self) -> int:
    """Optimizer updates of the whole run."""
    return self.num_train_steps * self.updates_per_step


# The config's sections that are groups of their own (the rest of its top
# level is training's).
OTHER_SECTIONS = ("model", "data", "eval", "mesh")
_SIZE = "-1 (the training run's size) or a size >= 0, below 2**31"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Evaluation's fields (`config.eval`). As written, a size of -1 takes
  training's (0 too for the batch and the segment; 0 memory slots is a
  size: no memory); the Experiment holds them resolved (`resolved`)."""

  split: str = values.text("validation", registry.SPLITS, "train, validation or test")
  batch_size: int = values.whole(-1, "[-1, 2**31)", _SIZE)
  segment_length: int = values.whole(-1, "[-1, 2**31)", _SIZE)
  memory_length: int = values.whole(-1, "[-1, 2**31)", _SIZE)
  compressed_memory_length: int = values.whole(-1, "[-1, 2**31)", _SIZE)
  # Per row, for training's periodic estimate; <= 0: the whole split.
  max_segments: int = values.whole(
    40, "[-2**31, 2**31)", "an integer below 2**31 (<= 0: the whole split)"
  )

  def __post_init__(self) -> None:
    values.check_fields(self, "eval.")

  def resolved(self, model: ModelConfig, batch_size: int) -> "EvalConfig":
    """The sizes a -1 leaves to training's made training's (`model`, the
    training `batch_size`)."""
    pick = lambda v, default: default if v < 0 else v
    return dataclasses.replace(
      self,
      batch_size=pick(self.batch_size, batch_size) or batch_size,
      segment_length=pick(self.segment_length, model.segment_length) or model.segment_length,
      memory_length=pick(self.memory_length, model.memory_length),
      compressed_memory_length=pick(self.compressed_memory_length, model.compressed_memory_length),
    )

  @property
  def sizes(self) -> dict[str, int]:
    """The four sizes by name (config.SIZE_FIELDS), as a result reports them."""
    return dict(
      batch_size=self.batch_size,
      segment_length=self.segment_length,
      memory_length=self.memory_length,
      compressed_memory_length=self.compressed_memory_length,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Experiment:
  """A checked experiment config: `config.check`'s result.

  Attributes:
    model, train, eval, mesh: the typed groups (this module's docstring);
      `eval` with its sizes resolved.
    data: the data section (`config.data`, compressive/data/config.py): the
      shared fields, and each source's section as its schema.
    mesh_shape: devices along each of mesh.axes, -1 resolved (against the
      devices `check` was given).
    graphdef, abstract_state: the model's structure and its parameters'
      shapes and logical axes (`config.abstract_model`), built once by
      `check`; the shardings are read from them.
  """

  model: ModelConfig
  train: TrainConfig
  eval: EvalConfig
  mesh: MeshConfig
  data: DataConfig
  mesh_shape: tuple[int, ...]
  graphdef: nnx.GraphDef
  abstract_state: nnx.State

  def to_dict(self) -> dict[str, Any]:
    """The config as this run understands it, every group's every field
    (evaluation's sizes resolved): what config.json, a checkpoint's
    identity and the logged hyperparameters record; `config.check` reads it
    back to the same Experiment."""
    return dict(
      values.to_dict(self.train),
      model=dataclasses.asdict(self.model),
      data=self.data.to_dict(),
      eval=values.to_dict(self.eval),
      mesh=values.to_dict(self.mesh),
    )


def check_written(top: Any) -> None:
  """ConfigError naming the first thing a config as a file holds it
  (config.json, an export's) holds that no version of it writes: a section
  that is not a mapping (null included), a key no group knows, a field its
  group requires that is missing, a value of another kind than its field's
  (values.check_section). Ranges and the rules between fields are left to
  `config.check`: a saved file's reader calls what this refuses damage."""
  if not isinstance(top, Mapping):
    raise ConfigError(f"the config must be a mapping of sections, not {type(top).__name__}")
  for name in ("model", "data"):
    if name not in top:
      raise ConfigError(f"the config has no {name} section")
  values.check_section(ModelConfig, top["model"], "model.")
  train = {k: v for k, v in top.items() if k not in OTHER_SECTIONS}
  values.check_section(TrainConfig, train, "", derived=("segment_length",))
  if "optimizer" in train:
    values.check_section(OptimizerConfig, train["optimizer"], "optimizer.")
  for name, group in (("eval", EvalConfig), ("mesh", MeshConfig)):
    if name in top:  # a field written as null takes its default (-1: the run's size)
      section = top[name]
      written = (
        {k: v for k, v in section.items() if v is not None}
        if isinstance(section, Mapping) and name == "eval"
        else section
      )
      values.check_section(group, written, f"{name}.")
  data_config.check_written(top["data"])
