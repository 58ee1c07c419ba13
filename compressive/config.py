"""The experiment config, checked once, at the entry point.

Configs are ml_collections ConfigDicts (configs/*.py). `check` reads one
field group after another (model, training, evaluation, data, mesh, the
tokenizer against the vocabulary, and the size of the run against this
machine) and raises ConfigError naming the first bad field, before anything
is built, compiled or read. It returns an `Experiment`
(compressive/experiment.py): the checked config with its typed, frozen
groups (`ModelConfig`, `TrainConfig`, `EvalConfig`, `MeshConfig`), which the
training and evaluation layers take as they are, without parsing the config
again. `default_config` is the other direction: every group's declared
defaults as a config file starts from them (configs/default.py).

This module sits above the model, data and scale layers (it asks each of
them about its own fields: the model's registries, the data sources, the
mesh rules) and below training and evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping, Optional, Sequence, TypeGuard

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections

from compressive import data as data_lib
from compressive import values
from compressive.errors import ConfigError, DoesNotFitError, MeshError
from compressive.experiment import EvalConfig, Experiment, TrainConfig
from compressive.model import compression
from compressive.model.config import ModelConfig, check_memory_sizes, check_segment_length
from compressive.model.transformer import CompressiveTransformer
from compressive.scale import mesh_checks, sharding
from compressive.scale.sharding import MeshConfig

_log = logging.getLogger("compressive")


def default_config() -> ml_collections.ConfigDict:
  """Every group's every field at its declared default, as a config file
  holds them (configs/default.py starts from it): the one copy of the
  defaults, so a field added to a group is in every config at once, and a
  command-line override of it is checked against this list.

  The model's sizes are left out: ModelConfig declares no default for them
  (every config chooses its model). The data section is locked, as
  `data.default_data_config` gives it (a source's mistyped field is an error
  rather than a new one); the other sections are open to the config file
  that builds on them, and `config.check` refuses a key no group knows.
  """
  model = {
    f.name: f.default
    for f in dataclasses.fields(ModelConfig)
    if f.default is not dataclasses.MISSING
  }
  return ml_collections.ConfigDict(
    dict(
      values.to_dict(TrainConfig()),
      model=model,
      data=data_lib.default_data_config(),
      eval=values.to_dict(EvalConfig()),
      mesh=values.to_dict(MeshConfig()),
    )
  )


def check_to_read(config: ml_collections.ConfigDict) -> Experiment:
  """A trained run's config (its saved one, or one replacing it) checked as
  a config read on this machine, not trained: neither its data nor its
  size against this machine (reading parameters needs neither), its mesh
  against every device."""
  return check(config, training=False, here=False, num_devices=jax.device_count())


def groups(config: Any) -> tuple[ModelConfig, TrainConfig, EvalConfig, MeshConfig]:
  """The config's typed groups (experiment.py), each checking its own
  fields as it is made (ConfigError naming the first bad one): the model,
  training (the top level and the optimizer), evaluation as written (sizes
  unresolved) and the mesh (its default where the config has none)."""
  top = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  for name in ("model", "data"):
    if not isinstance(top.get(name), Mapping):
      raise ConfigError(f"the config has no {name} section")
  model = ModelConfig.from_config(top["model"])
  train = TrainConfig.from_dict(top, model.segment_length)
  written = {k: v for k, v in (top.get("eval") or {}).items() if v is not None}  # None: -1
  evaluation = values.from_dict(EvalConfig, written, "eval.")
  return model, train, evaluation, MeshConfig.from_config(top.get("mesh") or {})


def check(
  config: ml_collections.ConfigDict,
  *,
  training: bool = True,
  num_devices: Optional[int] = None,
  here: Optional[bool] = None,
  capacity: Optional[tuple[int, str]] = None,
) -> Experiment:
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
  cfg, train, written, mesh = groups(config)
  _check_plugins(cfg)
  data = data_lib.DataConfig.from_dict(config.data)
  if here:
    data_lib.validate_data_config(data)
  _check_vocabulary(data, cfg, here, training)
  evaluation = written.resolved(cfg, train.batch_size)
  _check_eval_sizes(evaluation, cfg)
  _check_machine(cfg, train, evaluation, training, num_devices, here, capacity)
  graphdef, abstract_state = abstract_model(cfg, train.seed)
  # The mesh against the devices of every process, and the batch, heads,
  # hidden units and widths against the axes that split them: before any
  # compilation.
  shape = mesh_checks.validate(
    mesh, abstract_state, batch_size=train.batch_size, model=cfg, num_devices=num_devices
  )
  if training:
    _check_micro_batches(train, mesh, sharding.data_parallel_size(mesh, shape))
  return Experiment(
    model=cfg,
    train=train,
    eval=evaluation,
    mesh=mesh,
    data=data,
    mesh_shape=tuple(shape),
    graphdef=graphdef,
    abstract_state=abstract_state,
  )


def _check_machine(
  cfg: ModelConfig,
  train: TrainConfig,
  evaluation: EvalConfig,
  training: bool,
  num_devices: Optional[int],
  here: bool,
  capacity: Optional[tuple[int, str]],
) -> None:
  """What the run asks of the machine it is checked for (check's arguments):
  a GPU of this one for cuDNN attention (when `num_devices` is not given),
  and its size estimated against a device's memory, this machine's (`here`)
  or `capacity`, before the model is built."""
  if (
    num_devices is None
    and cfg.attention_implementation == "cudnn"
    and (jax.default_backend() != "gpu")
  ):
    raise ConfigError(
      "model.attention_implementation='cudnn' needs a GPU; this machine computes on "
      f"{jax.default_backend()} (aot.py can compile it for a GPU target)"
    )
  if here or capacity is not None:
    _check_fits(
      cfg,
      train,
      evaluation,
      training,
      capacity or _capacity_per_device(),
      num_devices or jax.device_count(),
    )


def _check_micro_batches(train: TrainConfig, mesh: MeshConfig, dp: int) -> None:
  """What only training's step needs: each micro-batch's rows splitting
  along the data axes."""
  accum = train.grad_accum_steps
  if accum > 1 and train.micro_batch_rows % dp:
    raise ConfigError(
      f"batch_size / grad_accum_steps = {train.batch_size} / {accum} = "
      f"{train.micro_batch_rows} rows per micro-batch is not divisible by {dp}, the "
      f"devices along mesh.data_axes={mesh.data_axes}; "
      "lower grad_accum_steps or raise batch_size"
    )


def _check_vocabulary(
  data_config: data_lib.DataConfig, cfg: ModelConfig, here: bool, training: bool
) -> None:
  """The tokenizer's vocabulary fits model.vocab_size: bytes' 256 anywhere;
  another tokenizer's (a SentencePiece model's file) where it is read,
  `here`. A model.vocab_size above the tokenizer's pieces trains (a
  vocabulary padded to a multiple that shards well is the user's choice),
  with a warning when `training`: the ids past the pieces never occur in
  the data, and the sampler never emits them (sample.py)."""
  if data_config.tokenizer == "bytes" and cfg.vocab_size < 256:
    raise ConfigError(
      f"model.vocab_size={cfg.vocab_size} is below 256, the bytes tokenizer's vocabulary"
    )
  if here:
    vocab = data_lib.get_tokenizer(data_config).vocab_size
    if vocab > cfg.vocab_size:
      raise ConfigError(
        f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's vocabulary ({vocab})"
      )
    if training and vocab < cfg.vocab_size:
      which = (
        f"data.spm_model={data_config.spm_model}"
        if data_config.tokenizer == "sentencepiece"
        else f"data.tokenizer={data_config.tokenizer}"
      )
      _log.warning(
        "model.vocab_size=%d is larger than the tokenizer's %d pieces (%s): ids %d-%d never "
        "occur in the data and are never sampled; --config.model.vocab_size=%d trains the "
        "vocabulary there is",
        cfg.vocab_size,
        vocab,
        which,
        vocab,
        cfg.vocab_size - 1,
        vocab,
      )


def fit_mesh_to_devices(
  config: ml_collections.ConfigDict, num_devices: Optional[int] = None
) -> bool:
  """For a saved config read on another machine: if its `mesh.shape` does
  not fit this machine's devices, replace it by every device on the first
  axis (data parallel; parameters whole on each device). Returns whether it
  changed the config. Training never does this: there a misfit is an error.
  """
  try:
    sharding.mesh_shape(MeshConfig.from_config(config.get("mesh") or {}), num_devices)
    return False
  except MeshError:
    axes = tuple(config.mesh.axes)
    config.mesh.shape = (-1,) + (1,) * (len(axes) - 1)
    # Still a misfit: the error is about mesh.axes etc.
    sharding.mesh_shape(MeshConfig.from_config(config.mesh), num_devices)
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
    4 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * cfg.d_ff
  )


def training_bytes_lower_bound(
  cfg: ModelConfig, train: TrainConfig, num_devices: Optional[int] = None
) -> int:
  """Bytes training needs at the least, per device, from shapes alone: the
  parameters with their gradients and Adam's two moments (float32), the
  memory, one step's batch, the residual stream every layer keeps for the
  backward pass, and one layer's attention scores, each split over every
  device (a lower bound: what the compiled step holds is more)."""
  d, layers, itemsize = cfg.d_model, cfg.num_layers, jnp.dtype(cfg.dtype).itemsize
  params = _parameter_count(cfg)
  b, t, s = train.batch_size, cfg.segment_length, train.segments_per_step
  rows = train.micro_batch_rows
  window = train.gradient_window  # a window keeps its segments' activations
  keys = cfg.compressed_memory_length + cfg.memory_length + t
  queries = cfg.attention_chunk_size or t
  total = (
    16 * params
    + layers * b * (cfg.memory_length + cfg.compressed_memory_length) * d * itemsize
    + 3 * s * b * t * 4
    + layers * rows * t * d * itemsize * window
    + rows * cfg.num_heads * queries * keys * 4
  )
  return total // (num_devices or jax.device_count())


def evaluation_bytes_lower_bound(
  cfg: ModelConfig, evaluation: EvalConfig, num_devices: Optional[int] = None
) -> int:
  """Bytes evaluation at `evaluation`'s (resolved) sizes (eval.*, or eval.py's
  --memory_length ...) needs at the least, per device: the float32
  parameters, every layer's memory and compressed memory, one segment's
  residual stream and one layer's attention scores."""
  b, t = evaluation.batch_size, evaluation.segment_length
  slots = evaluation.memory_length + evaluation.compressed_memory_length
  itemsize = jnp.dtype(cfg.dtype).itemsize
  queries = min(cfg.attention_chunk_size or t, t)
  total = (
    4 * _parameter_count(cfg)
    + cfg.num_layers * b * slots * cfg.d_model * itemsize
    + 2 * b * t * cfg.d_model * itemsize
    + b * cfg.num_heads * queries * (slots + t) * 4
  )
  return total // (num_devices or jax.device_count())


def _check_fits(
  cfg: ModelConfig,
  train: TrainConfig,
  evaluation: EvalConfig,
  training: bool,
  capacity: tuple[int, str],
  num_devices: int,
) -> None:
  """ConfigError, before anything is built or allocated, when training (with
  `training`) or evaluation at the evaluation sizes cannot fit `capacity`
  (bytes per device, what) by the lower bounds above."""
  have, what = capacity
  need = training_bytes_lower_bound(cfg, train, num_devices) if training else 0
  if need > have:
    raise DoesNotFitError(
      f"training this config needs at least {need / 2**30:,.1f} GiB per device "
      f"(parameters, optimizer state, memory, batch and activations, from their shapes), "
      f"{need / have:,.1f} times the {have / 2**30:,.1f} GiB of {what}: lower batch_size "
      f"(now {train.batch_size}) or the model's sizes, raise grad_accum_steps (now "
      f"{train.grad_accum_steps}), or use more devices",
      need,
      have,
    )
  need = evaluation_bytes_lower_bound(cfg, evaluation, num_devices)
  if training:  # the in-loop estimate runs beside the optimizer state
    need += 12 * _parameter_count(cfg) // num_devices
  if need > have:
    raise DoesNotFitError(
      f"evaluating this config needs at least {need / 2**30:,.1f} GiB per device "
      f"(parameters, {evaluation.memory_length} + {evaluation.compressed_memory_length} "
      f"memory slots x {cfg.num_layers} layers x {evaluation.batch_size} rows, activations), "
      f"{need / have:,.1f} times the {have / 2**30:,.1f} GiB of {what}: lower the "
      "evaluation sizes (eval.memory_length, eval.compressed_memory_length, eval.batch_size;"
      " a tool's --memory_length ...) or the model's sizes",
      need,
      have,
    )


def _is_int(value: object) -> TypeGuard[int]:
  return isinstance(value, int) and not isinstance(value, bool)


def profile_steps(value: Any) -> Optional[tuple[int, int]]:
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
      raise ConfigError(
        f"--profile_steps={value} must be START,END: two step numbers with 1 <= START <= END"
      )
    raise ConfigError(f"profile_steps={value!r} must be (START, END) with 1 <= START <= END")
  return start, end


SIZE_FIELDS = ("batch_size", "segment_length", "memory_length", "compressed_memory_length")


def _check_eval_sizes(evaluation: EvalConfig, cfg: ModelConfig) -> None:
  """Evaluation's resolved sizes against the model's rules for them."""
  check_memory_sizes(
    cfg,
    evaluation.memory_length,
    evaluation.compressed_memory_length,
    evaluation.batch_size,
    prefix="eval",
  )
  check_segment_length(
    cfg, evaluation.segment_length, evaluation.compressed_memory_length, "eval.segment_length"
  )


def check_saved(
  config: ml_collections.ConfigDict,
  *,
  sizes: Optional[Mapping[str, Optional[int]]] = None,
  mesh_shape: Optional[Sequence[str]] = None,
) -> tuple[Experiment, Optional[str]]:
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
    note = (
      f"note: the training mesh does not fit the {jax.device_count()} devices here; "
      f"running on mesh.shape={config.mesh.shape} (choose with --mesh_shape)"
    )
  try:
    experiment = check(config, training=False)
  except MeshError as e:
    raise MeshError(f"{e} (set --mesh_shape for this machine)") from None
  return experiment, note
