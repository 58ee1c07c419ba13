"""The checked experiment: typed, frozen config groups, built once by `config.check`.

An experiment config is a ConfigDict (configs/*.py) while it is written,
overridden and checked; `config.check` reads it once and returns an
`Experiment`, whose groups are what the layers below the entry points take:

    experiment.model   ModelConfig   (compressive/model/config.py)
    experiment.train   TrainConfig   batch, steps, accumulation, cadences,
                                     prefetch, seed, optimizer (OptimizerConfig)
    experiment.eval    EvalConfig    evaluation's sizes (resolved), split, max_segments
    experiment.mesh    MeshConfig    (compressive/scale/sharding.py)
    experiment.data    the data section, which the data sources own (each
                       source's section is its own schema: docs/DESIGN.md)

The ConfigDict itself (`experiment.config`) is kept only for what records the
config as written: config.json, the run's identity in every checkpoint, and
the hyperparameters logged. Each group copies its fields' values as the
config holds them (no conversion), so a run computes exactly what it did
from the config.

The groups are built from a config that `check` has checked (their
`from_config` reads, and checks nothing), so a field is named by `check` in
one line before any group exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from flax import nnx

from compressive.model.config import ModelConfig
from compressive.scale.sharding import MeshConfig


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """`config.optimizer`: Adam(W) with warmup and cosine decay (training/step.py)."""
  name: str  # adam | adamw
  learning_rate: float  # the peak, after warmup
  warmup_steps: int  # in train steps
  final_lr_fraction: float  # the decay's end, as a fraction of the peak
  b1: float
  b2: float
  eps: float
  weight_decay: float  # adamw's
  grad_clip_norm: float  # inf: no clipping

  @classmethod
  def from_config(cls, section: Any) -> "OptimizerConfig":
    return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Training's fields of the config (its top level and `optimizer`).

  `segment_length` is the model's (model.segment_length), here for the
  derived sizes. `prefetch_steps` is checked only for a config checked to
  train (`check(training=True)`).
  """
  seed: int
  batch_size: int  # global rows per step
  num_train_steps: int
  segments_per_step: int  # consecutive segments per step
  grad_accum_steps: int  # micro-batches per segment's update
  gradient_window: int  # segments per update, the loss reaching back through the memory
  segment_length: int
  log_every_steps: int
  eval_every_steps: int  # 0: never (but at the end)
  checkpoint_every_steps: int  # 0: never (but at the end and on a stop)
  keep_checkpoints: int
  prefetch_steps: Optional[int]  # steps' batches made ahead; 0: none
  optimizer: OptimizerConfig

  @classmethod
  def from_config(cls, config: Any) -> "TrainConfig":
    """From a (checked) experiment config."""
    return cls(
        seed=config.seed, batch_size=config.batch_size, num_train_steps=config.num_train_steps,
        segments_per_step=config.segments_per_step, grad_accum_steps=config.grad_accum_steps,
        gradient_window=config.get("gradient_window", 1),
        segment_length=config.model.segment_length, log_every_steps=config.log_every_steps,
        eval_every_steps=config.eval_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
        keep_checkpoints=config.keep_checkpoints, prefetch_steps=config.get("prefetch_steps"),
        optimizer=OptimizerConfig.from_config(config.optimizer))

  @property
  def micro_batch_rows(self) -> int:
    """Rows per micro-batch: batch_size / grad_accum_steps (check: divisible)."""
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


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Evaluation's fields (`config.eval`), its sizes resolved (`config.eval_sizes`:
  -1 takes training's)."""
  batch_size: int
  segment_length: int
  memory_length: int
  compressed_memory_length: int
  split: str  # train | validation | test
  max_segments: int  # per row, for training's periodic estimate; <= 0: the whole split

  @property
  def sizes(self) -> dict[str, int]:
    """The four sizes by name (config.SIZE_FIELDS), as a result reports them."""
    return dict(batch_size=self.batch_size, segment_length=self.segment_length,
                memory_length=self.memory_length,
                compressed_memory_length=self.compressed_memory_length)


@dataclasses.dataclass(frozen=True, eq=False)
class Experiment:
  """A checked experiment config: `config.check`'s result.

  Attributes:
    config: the ConfigDict as checked: what a workdir's config.json records,
      a checkpoint's identity and the logged hyperparameters are read from;
      nothing else reads it.
    model, train, eval, mesh: the typed groups (this module's docstring).
    mesh_shape: devices along each of mesh.axes, -1 resolved (against the
      devices `check` was given).
    graphdef, abstract_state: the model's structure and its parameters'
      shapes and logical axes (`config.abstract_model`), built once by
      `check`; the shardings are read from them.
  """
  config: Any
  model: ModelConfig
  train: TrainConfig
  eval: EvalConfig
  mesh: MeshConfig
  mesh_shape: tuple[int, ...]
  graphdef: nnx.GraphDef
  abstract_state: nnx.State

  @property
  def data(self) -> Any:
    """The data section (`config.data`): the data sources' own schema."""
    return self.config.data
