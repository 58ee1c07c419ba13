"""The experiment config, checked once, at the entry point.

Configs are ml_collections ConfigDicts (configs/*.py). `check` reads one
field group after another (model, training, evaluation, data, mesh, the
tokenizer against the vocabulary, and the size of the run against this
machine) and raises ConfigError naming the first bad field, before anything
is built, compiled or read. It returns an `Experiment`
(compressive/experiment.py): the checked config with its typed, frozen
groups (`ModelConfig`, `TrainConfig`, `EvalConfig`, `MeshConfig`), which the
training and evaluation layers take as they are, without parsing the config
again.

This module sits above the model, data and scale layers (it asks each of
them about its own fields: the model's registries, the data sources, the
mesh rules) and below training and evaluation.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional, Sequence, TypeGuard, Union

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections

from compressive import data as data_lib
from compressive import values
from compressive.errors import ConfigError, DoesNotFitError, MeshError
from compressive.experiment import (
    EvalConfig, Experiment, TrainConfig)
from compressive.model import compression
from compressive.model.config import ModelConfig, check_memory_sizes, check_segment_length
from compressive.model.transformer import CompressiveTransformer
from compressive.scale import sharding
from compressive.scale.sharding import MeshConfig

_log = logging.getLogger("compressive")


# What the library's entry functions take: a checked Experiment, or a config
# to check (a library caller's).
ConfigOrExperiment = Union[ml_collections.ConfigDict, Experiment]


def experiment_of(config: ConfigOrExperiment, **check_args) -> Experiment:
  """`config` as an Experiment: checked now when it is a ConfigDict (a
  library caller's), as it is when an entry point already checked it."""
  return config if isinstance(config, Experiment) else check(config, **check_args)


_INT32_MAX = 2**31 - 1


def _is_int(value) -> TypeGuard[int]:
  return isinstance(value, int) and not isinstance(value, bool)


def validate_training_config(config: ml_collections.ConfigDict) -> None:
  """The training and optimizer fields, each against its meaningful range."""
  for name in ("batch_size", "num_train_steps", "segments_per_step", "log_every_steps",
               "keep_checkpoints"):
    value = config.get(name)
    if not _is_int(value) or not 1 <= value <= _INT32_MAX:
      raise ConfigError(f"{name}={value!r} must be a positive integer below 2**31")
  for name in ("eval_every_steps", "checkpoint_every_steps"):
    value = config.get(name)
    if not _is_int(value) or not 0 <= value <= _INT32_MAX:
      raise ConfigError(f"{name}={value!r} must be an integer >= 0 (0: never), below 2**31")
  updates = config.num_train_steps * config.segments_per_step
  if updates > _INT32_MAX:
    raise ConfigError(
        f"num_train_steps x segments_per_step = {config.num_train_steps} x "
        f"{config.segments_per_step} = {updates} optimizer updates; the update counter is a "
        "32-bit integer: make it below 2**31")
  # The model's PRNG key holds 32 bits (2**32 would be seed 0 again), and
  # dropout's key is seed + 1.
  values.integer("seed", config.get("seed"), "[0, 2**32 - 1)")
  opt = config.optimizer
  if opt.name not in ("adam", "adamw"):
    raise ConfigError(f"optimizer.name={opt.name!r} is unknown; choose adam or adamw")
  _check_optimizer_values(opt)
  values.integer("optimizer.warmup_steps", opt.get("warmup_steps"), "[0, 2**31)",
                 must="an integer >= 0, below 2**31")
  accum = grad_accum_steps(config)
  if not _is_int(accum) or accum < 1:
    raise ConfigError(f"grad_accum_steps={accum!r} must be a positive integer (1: no accumulation)")
  _check_gradient_window(config.get("gradient_window", 1), config.segments_per_step, accum)
  if config.batch_size % accum:
    raise ConfigError(f"batch_size={config.batch_size} is not divisible by "
                      f"grad_accum_steps={accum}: each micro-batch takes batch_size / "
                      "grad_accum_steps rows")


def _check_gradient_window(window, segments_per_step: int, accum: int) -> None:
  """gradient_window: whole windows in every step, without accumulation."""
  if not _is_int(window) or not 1 <= window <= _INT32_MAX:
    raise ConfigError(f"gradient_window={window!r} must be a positive integer (segments per "
                      "update; 1: one update per segment, the paper's)")
  if segments_per_step % window:
    raise ConfigError(f"segments_per_step={segments_per_step} is not a multiple of "
                      f"gradient_window={window}: a step makes one update per whole window")
  if window > 1 and accum > 1:
    raise ConfigError(f"gradient_window={window} with grad_accum_steps={accum}: a window's "
                      "gradient is not accumulated over micro-batches; set one of them to 1")


# Each optimizer value's range, checked on its float32 (the optimizer's dtype).
OPTIMIZER_RANGES = {  # field: (interval, what it must be)
    "learning_rate": ("(0, inf)", "a finite number > 0"),
    "final_lr_fraction": ("[0, 1]", "in [0, 1] (a fraction of the peak)"),
    "b1": ("[0, 1)", "in [0, 1)"),
    "b2": ("[0, 1)", "in [0, 1)"),
    "eps": ("(0, inf)", "a finite number > 0"),
    "weight_decay": ("[0, inf)", "a finite number >= 0"),
    "grad_clip_norm": ("(0, inf]", "> 0 (inf: no clipping)"),
}


def _check_optimizer_values(opt: ml_collections.ConfigDict) -> None:
  """The optimizer's numbers as float32 holds them, and the products the
  update computes from them (the decayed rate, the decay term's rate)."""
  held = {name: values.number(f"optimizer.{name}", opt.get(name), interval, must=must)
          for name, (interval, must) in OPTIMIZER_RANGES.items()}
  for other, what in (("final_lr_fraction", "the final learning rate"),
                      ("weight_decay", "the weight decay's rate")):
    if held[other]:
      product = float(f"{held['learning_rate'] * held[other]:.6g}")
      values.number(f"optimizer.learning_rate x optimizer.{other}", product, "(0, inf)",
                    must=f"a finite number > 0 ({what})")


def grad_accum_steps(config: ml_collections.ConfigDict) -> int:
  """config.grad_accum_steps (None when a config lacks it: validation then
  names the field)."""
  return config.get("grad_accum_steps")


def check(config: ml_collections.ConfigDict, *, training: bool = True,
          num_devices: Optional[int] = None, here: Optional[bool] = None,
          capacity: Optional[tuple[int, str]] = None) -> Experiment:
  """Checks the experiment config before anything is built; ConfigError.

  `training=False` (evaluating, analysing or sampling a trained config on
  this machine's mesh) skips what only training's step needs: the
  micro-batches of grad_accum_steps splitting along the mesh, and training's
  part of the memory estimate (evaluation's sizes are estimated either way).
  `num_devices`: the mesh's devices, default every device of this
  run (aot.py passes a target's). `here`: whether the config is to run on
  this machine, so that its data config (paths, the tokenizer's model) and
  its size are checked against it; default: when `num_devices` is not given.
  `capacity`: (bytes per device, what they are) to estimate the size
  against instead of this machine's (aot.py passes a target's). The
  estimate comes before the model is built, so a size of any kind (layers
  too) is refused in a moment, never after minutes of building.
  """
  here = num_devices is None if here is None else here
  cfg = ModelConfig.from_config(config.model)
  _check_plugins(cfg)
  validate_training_config(config)
  if here:
    data_lib.validate_data_config(config.data)
  _check_vocabulary(config.data, cfg, here)
  validate_eval_config(config, cfg)
  values.config_floats(config)  # every float field as float32 holds it, listed or not
  # The mesh against the devices of every process, and the batch, heads,
  # hidden units and widths against the axes that split them: before any
  # compilation.
  if num_devices is None and cfg.attention_implementation == "cudnn" and (
      jax.default_backend() != "gpu"):
    raise ConfigError(
        "model.attention_implementation='cudnn' needs a GPU; this machine computes on "
        f"{jax.default_backend()} (aot.py can compile it for a GPU target)")
  accum = grad_accum_steps(config)
  if here or capacity is not None:
    _check_fits(config, cfg, accum, training, capacity or _capacity_per_device(),
                num_devices or jax.device_count())
  graphdef, abstract_state = abstract_model(cfg, config.seed)
  mesh = MeshConfig.from_config(config.mesh)
  shape = sharding.validate(mesh, abstract_state, batch_size=config.batch_size, model=cfg,
                            num_devices=num_devices)
  if training:
    _check_training_split(config, accum, mesh, sharding.data_parallel_size(mesh, shape))
  sizes = eval_sizes(config)
  return Experiment(
      config=config, model=cfg, train=TrainConfig.from_config(config),
      eval=EvalConfig(**sizes, split=config.eval.split, max_segments=config.eval.max_segments),
      mesh=mesh, mesh_shape=tuple(shape), graphdef=graphdef, abstract_state=abstract_state)


def _check_training_split(config, accum: int, mesh: MeshConfig, dp: int) -> None:
  """What only training's step needs: the prefetch depth, and each
  micro-batch's rows splitting along the data axes."""
  value = config.get("prefetch_steps")
  if not _is_int(value) or not 0 <= value <= 64:
    raise ConfigError(f"prefetch_steps={value!r} must be an integer in [0, 64] (steps' "
                      "batches made ahead in a background thread; 0: none)")
  if accum > 1 and (config.batch_size // accum) % dp:
    raise ConfigError(
        f"batch_size / grad_accum_steps = {config.batch_size} / {accum} = "
        f"{config.batch_size // accum} rows per micro-batch is not divisible by {dp}, the "
        f"devices along mesh.data_axes={mesh.data_axes}; "
        "lower grad_accum_steps or raise batch_size")


def _check_vocabulary(data_config, cfg: ModelConfig, here: bool) -> None:
  """The tokenizer's vocabulary fits model.vocab_size: bytes' 256 anywhere;
  another tokenizer's (a SentencePiece model's file) where it is read,
  `here`."""
  if data_config.tokenizer == "bytes" and cfg.vocab_size < 256:
    raise ConfigError(f"model.vocab_size={cfg.vocab_size} is below 256, the bytes tokenizer's vocabulary")
  if here:
    vocab = data_lib.get_tokenizer(data_config).vocab_size
    if vocab > cfg.vocab_size:
      raise ConfigError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's "
                        f"vocabulary ({vocab})")


def default_mesh_config() -> ml_collections.ConfigDict:
  """`config.mesh` of every experiment unless it says otherwise (configs/default.py
  writes it out; tests/tools/test_configs.py holds the two equal)."""
  mesh = ml_collections.ConfigDict()
  mesh.axes = ("data", "fsdp", "tensor")
  mesh.shape = (-1, 1, 1)  # -1: the devices the other axes leave
  mesh.data_axes = ("data", "fsdp")  # batch and memory rows are split along these
  mesh.logical_axis_rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  return mesh


def fit_mesh_to_devices(config: ml_collections.ConfigDict, num_devices: Optional[int] = None) -> bool:
  """For a saved config read on another machine: if its `mesh.shape` does
  not fit this machine's devices, replace it by every device on the first
  axis (data parallel; parameters whole on each device). Returns whether it
  changed the config. Training never does this: there a misfit is an error.
  """
  try:
    sharding.mesh_shape(config, num_devices)
    return False
  except ConfigError:
    if "mesh" not in config:
      raise
    axes = tuple(config.mesh.axes)
    config.mesh.shape = (-1,) + (1,) * (len(axes) - 1)
    sharding.mesh_shape(config, num_devices)  # still a misfit: the error is about mesh.axes etc.
    return True


def abstract_model(cfg: ModelConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
  """The model's (graphdef, abstract state): shapes and logical axes, no arrays."""
  model = nnx.eval_shape(lambda: CompressiveTransformer(cfg, rngs=nnx.Rngs(seed)))
  return nnx.split(model)


def _check_plugins(cfg: ModelConfig) -> None:
  """The model's plugin names against their registries (which own them),
  and what the compression declares (its FLOPs) against its contract."""
  if cfg.compressed_memory_length:
    compression.declared_flops(cfg.compression, cfg.compression_rate, cfg.d_model)
  else:
    compression.resolve(cfg.compression)


def _capacity_per_device() -> tuple[int, str]:
  """(bytes, what) one device of this run can hold: an accelerator's memory
  limit, or this host's RAM shared by its local devices (CPU)."""
  device = jax.local_devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{device.device_kind}'s memory"
  ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return ram // jax.local_device_count(), "this host's RAM per local device"


def _parameter_count(cfg: ModelConfig) -> int:
  return cfg.vocab_size * cfg.d_model + cfg.num_layers * (
      4 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * cfg.d_ff)


def training_bytes_lower_bound(config: ml_collections.ConfigDict, cfg: ModelConfig,
                               accum: int, num_devices: Optional[int] = None) -> int:
  """Bytes training needs at the least, per device, from shapes alone: the
  parameters with their gradients and Adam's two moments (float32), the
  memory, one step's batch, the residual stream every layer keeps for the
  backward pass, and one layer's attention scores, each split over every
  device (a lower bound: what the compiled step holds is more)."""
  d, layers, itemsize = cfg.d_model, cfg.num_layers, jnp.dtype(cfg.dtype).itemsize
  params = _parameter_count(cfg)
  b, t, s = config.batch_size, cfg.segment_length, config.segments_per_step
  rows = b // max(accum, 1)
  window = config.get("gradient_window", 1)  # a window keeps its segments' activations
  keys = cfg.compressed_memory_length + cfg.memory_length + t
  queries = cfg.attention_chunk_size or t
  total = (16 * params
           + layers * b * (cfg.memory_length + cfg.compressed_memory_length) * d * itemsize
           + 3 * s * b * t * 4
           + layers * rows * t * d * itemsize * window
           + rows * cfg.num_heads * queries * keys * 4)
  return total // (num_devices or jax.device_count())


def evaluation_bytes_lower_bound(config: ml_collections.ConfigDict, cfg: ModelConfig,
                                 num_devices: Optional[int] = None) -> int:
  """Bytes evaluation at the config's evaluation sizes (eval_sizes: eval.*,
  or eval.py's --memory_length ...) needs at the least, per device: the
  float32 parameters, every layer's memory and compressed memory, one
  segment's residual stream and one layer's attention scores."""
  sizes = eval_sizes(config)
  b, t = sizes["batch_size"], sizes["segment_length"]
  slots = sizes["memory_length"] + sizes["compressed_memory_length"]
  itemsize = jnp.dtype(cfg.dtype).itemsize
  queries = min(cfg.attention_chunk_size or t, t)
  total = (4 * _parameter_count(cfg)
           + cfg.num_layers * b * slots * cfg.d_model * itemsize
           + 2 * b * t * cfg.d_model * itemsize
           + b * cfg.num_heads * queries * (slots + t) * 4)
  return total // (num_devices or jax.device_count())


def _check_fits(config: ml_collections.ConfigDict, cfg: ModelConfig, accum: int, training: bool,
                capacity: tuple[int, str], num_devices: int) -> None:
  """ConfigError, before anything is built or allocated, when training (with
  `training`) or evaluation at the evaluation sizes cannot fit `capacity`
  (bytes per device, what) by the lower bounds above."""
  have, what = capacity
  need = training_bytes_lower_bound(config, cfg, accum, num_devices) if training else 0
  if need > have:
    raise DoesNotFitError(
        f"training this config needs at least {need / 2**30:,.1f} GiB per device "
        f"(parameters, optimizer state, memory, batch and activations, from their shapes), "
        f"{need / have:,.1f} times the {have / 2**30:,.1f} GiB of {what}: lower batch_size "
        f"(now {config.batch_size}) or the model's sizes, raise grad_accum_steps (now {accum}), "
        "or use more devices", need, have)
  need = evaluation_bytes_lower_bound(config, cfg, num_devices)
  if training:  # the in-loop estimate runs beside the optimizer state
    need += 12 * _parameter_count(cfg) // num_devices
  if need > have:
    sizes = eval_sizes(config)
    raise DoesNotFitError(
        f"evaluating this config needs at least {need / 2**30:,.1f} GiB per device "
        f"(parameters, {sizes['memory_length']} + {sizes['compressed_memory_length']} memory "
        f"slots x {cfg.num_layers} layers x {sizes['batch_size']} rows, activations), "
        f"{need / have:,.1f} times the {have / 2**30:,.1f} GiB of {what}: lower the "
        "evaluation sizes (eval.memory_length, eval.compressed_memory_length, eval.batch_size;"
        " a tool's --memory_length ...) or the model's sizes", need, have)


def profile_steps(value) -> Optional[tuple[int, int]]:
  """A profiler trace's steps: "START,END" (train.py's --profile_steps) or
  (START, END), as (START, END) with 1 <= START <= END; None for none
  ("" or None); ConfigError otherwise."""
  if value is None or (isinstance(value, str) and not value.strip()):
    return None
  parts = value.split(",") if isinstance(value, str) else value
  try:
    start, end = (int(p) if isinstance(p, str) else p for p in parts)
  except (TypeError, ValueError):
    start = end = None
  if not (_is_int(start) and _is_int(end) and 1 <= start <= end):
    if isinstance(value, str):
      raise ConfigError(f"--profile_steps={value} must be START,END: two step numbers with "
                        "1 <= START <= END")
    raise ConfigError(f"profile_steps={value!r} must be (START, END) with 1 <= START <= END")
  return start, end


SIZE_FIELDS = ("batch_size", "segment_length", "memory_length", "compressed_memory_length")


def eval_sizes(config: ml_collections.ConfigDict) -> dict[str, int]:
  """Evaluation segment and memory sizes. -1 (or unset) takes training's; so does 0 for
  the batch and segment sizes (0 memory slots is a size: no memory)."""
  ev, m = config.eval, config.model
  pick = lambda v, default: default if v is None or v < 0 else v
  return dict(
      batch_size=pick(ev.batch_size, config.batch_size) or config.batch_size,
      segment_length=pick(ev.segment_length, m.segment_length) or m.segment_length,
      memory_length=pick(ev.memory_length, m.memory_length),
      compressed_memory_length=pick(ev.compressed_memory_length, m.compressed_memory_length),
  )


def validate_eval_config(config: ml_collections.ConfigDict, cfg: ModelConfig) -> None:
  for name in SIZE_FIELDS:
    value = config.eval.get(name)
    if value is not None:
      values.integer(f"eval.{name}", value, "[-1, 2**31)",
                     must="-1 (the training run's size) or a size >= 0, below 2**31")
  values.integer("eval.max_segments", config.eval.get("max_segments"), "[-2**31, 2**31)",
                 must="an integer below 2**31 (<= 0: the whole split)")
  sizes = eval_sizes(config)
  check_memory_sizes(cfg, sizes["memory_length"], sizes["compressed_memory_length"],
                     sizes["batch_size"], prefix="eval")
  check_segment_length(cfg, sizes["segment_length"], sizes["compressed_memory_length"],
                       "eval.segment_length")
  if config.eval.split not in ("train", "validation", "test"):
    raise ConfigError(f"eval.split={config.eval.split!r} must be train, validation or test")


def check_saved(config: ml_collections.ConfigDict, *,
                sizes: Optional[Mapping[str, Optional[int]]] = None,
                mesh_shape: Optional[Sequence[str]] = None) -> tuple[Experiment, Optional[str]]:
  """A saved training config made ready for the tools that read a workdir
  (eval.py, analyze.py, sample.py), in place, and checked (ConfigError).

  Args:
    sizes: evaluation sizes to set (SIZE_FIELDS; None leaves one as saved).
    mesh_shape: --mesh_shape's values (devices along each of mesh.axes, -1:
      the rest); None keeps the saved mesh if it fits this machine's devices,
      else data parallel over all of them.

  Returns:
    (the checked Experiment, a note for the user when the saved mesh was
    replaced, else None).
  """
  for name, value in (sizes or {}).items():
    if name not in SIZE_FIELDS:
      raise ValueError(f"{name} is not one of {SIZE_FIELDS}")
    if value is not None:
      config.eval[name] = value
  note = None
  if mesh_shape is not None:
    try:
      config.mesh.shape = tuple(int(n) for n in mesh_shape)
    except ValueError:
      raise ConfigError(f"--mesh_shape={','.join(map(str, mesh_shape))} must be integers") from None
  elif fit_mesh_to_devices(config):
    note = (f"note: the training mesh does not fit the {jax.device_count()} devices here; "
            f"running on mesh.shape={config.mesh.shape} (choose with --mesh_shape)")
  try:
    experiment = check(config, training=False)
  except MeshError as e:
    raise MeshError(f"{e} (set --mesh_shape for this machine)") from None
  return experiment, note
