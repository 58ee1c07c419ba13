"""Typed, validated view of the `model` config.

Configs are ml_collections ConfigDicts (configs/*.py). The model reads them
through `ModelConfig`, a frozen (hashable) dataclass, so that a bad value is
reported once, by field name, before anything is built or compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from compressive import values
from compressive.errors import ConfigError
from compressive.model.losses import RECONSTRUCTION_LOSSES

DTYPES = ("float32", "bfloat16")
# model.remat: what the backward pass keeps of each layer's forward pass
# (jax.checkpoint policies): everything; only the layer's inputs (recompute
# the rest); or also the outputs of its weight matmuls (not the attention's
# [B, H, T, K] products, which are recomputed).
REMAT_POLICIES = ("none", "full", "matmuls")
# model.norm: "pre" normalises each sublayer's input (and the output, once,
# before the head); "post" normalises after each residual sum, as the
# paper's Algorithm 1 and Transformer-XL do.
NORMS = ("pre", "post")
# model.memory_gradient: where the language-modelling loss of later segments
# may reach through the memory, within a gradient window of segments
# (training's `gradient_window`; docs/DESIGN.md §Task-taught compression).
# "none": nowhere, the paper's (memories stop-gradient, the compression
# trained by its reconstruction loss alone); "compressor": the compressed
# slots keep their gradient, so later queries train f_c (what it is given
# stays stop-gradient); "memories": every stored slot keeps its gradient, so
# the loss reaches the layers that wrote the memory and f_c's inputs too.
MEMORY_GRADIENTS = ("none", "compressor", "memories")
# model.compressed_keys_values: the projections a layer reads its compressed
# slots through. "shared": the memory's and the segment's W_k and W_v (the
# paper's); "own": W_k^c and W_v^c of their own (beyond the paper,
# docs/DESIGN.md §Compressed slots read through their own projections), so
# that a compression's code need not be read as raw inputs are.
COMPRESSED_KEYS_VALUES = ("shared", "own")


def _positions() -> tuple[str, ...]:
  from compressive.model.attention import POSITIONS

  return POSITIONS


def _implementations() -> tuple[str, ...]:
  from compressive.model.attention import IMPLEMENTATIONS

  return tuple(IMPLEMENTATIONS)


_SIZE = "an integer >= 1, below 2**31"
_SLOTS = "an integer >= 0, below 2**31"
_REQUIRED = dataclasses.MISSING  # a field every model section gives


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model section (`config.model`), typed and frozen: each field
  declares its kind and range or choices once (values.whole, ...) and is
  checked against them as the group is made (`__post_init__`), then the
  rules between the fields (`_check_rules`); a section read with
  `from_config` refuses a field it does not know."""

  vocab_size: int = values.whole(_REQUIRED, "[1, 2**31)", _SIZE)
  num_layers: int = values.whole(_REQUIRED, "[1, 2**31)", _SIZE)
  num_heads: int = values.whole(_REQUIRED, "[1, 2**31)", _SIZE)
  d_model: int = values.whole(_REQUIRED, "[1, 2**31)", _SIZE)
  d_ff: int = values.whole(_REQUIRED, "[1, 2**31)", _SIZE)
  segment_length: int = values.whole(_REQUIRED, "[1, 2**31)", _SIZE)
  memory_length: int = values.whole(_REQUIRED, "[0, 2**31)", _SLOTS)
  compressed_memory_length: int = values.whole(_REQUIRED, "[0, 2**31)", _SLOTS)
  compression_rate: int = values.whole(_REQUIRED, "[1, 2**31)", _SIZE)
  # A name of the compression registry (model/compression.py), or
  # module:Name; the registry checks it (`resolve`).
  compression: str = values.text("conv")
  reconstruction_loss: str = values.text("attention", RECONSTRUCTION_LOSSES)
  positions: str = values.text("relative", _positions)  # relative (Transformer-XL) | rope (rotary)
  # NORMS: layer norm before each sublayer, or after its residual sum (the
  # paper's, and every shipped config's). "pre" here because a config saved
  # before the field existed (a workdir's config.json) was trained pre-norm.
  norm: str = values.text("pre", NORMS)
  dropout_rate: float = values.real(0.0, "[0, 1)")
  dtype: str = values.text("float32", DTYPES)  # activations; parameters are always float32
  # One stacked layer, run by lax.scan over the layer axis.
  scan_layers: bool = values.flag(False)
  remat: str = values.text("none", REMAT_POLICIES)
  # Queries per attention chunk; 0 = the whole segment.
  attention_chunk_size: int = values.whole(0, "[0, 2**31)", _SLOTS)
  # rope's fused attention: auto | xla | cudnn
  attention_implementation: str = values.text("auto", _implementations)
  memory_gradient: str = values.text("none", MEMORY_GRADIENTS)  # "none" is the paper's
  # "shared" is the paper's (COMPRESSED_KEYS_VALUES above)
  compressed_keys_values: str = values.text("shared", COMPRESSED_KEYS_VALUES)

  @classmethod
  def from_config(cls, config: ModelConfig | Mapping[str, Any]) -> ModelConfig:
    """From the config's model section (a ConfigDict or mapping; a field it
    lacks takes its default, but the sizes, which it must give) or a
    ModelConfig; ConfigError naming a field it does not know, one it lacks
    or one of another kind (values.from_dict)."""
    if isinstance(config, ModelConfig):
      return config
    return values.from_dict(cls, config, "model.")

  def __post_init__(self) -> None:
    values.check_fields(self, "model.")
    _check_rules(self)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads


def require(cfg: ModelConfig, taker: str) -> None:
  """TypeError unless `cfg` is a ModelConfig: the model layer takes the
  checked group only (a ConfigDict would be read unchecked, attribute by
  attribute); a caller holding a config's model section converts it once,
  with ModelConfig.from_config."""
  if not isinstance(cfg, ModelConfig):
    raise TypeError(
      f"{taker} takes a ModelConfig, not {type(cfg).__name__}: "
      "ModelConfig.from_config(config.model) reads a config's model section"
    )


# How deep a model may be built, checked before anything is built, as the
# memory estimate checks its widths: depth costs time that no memory
# estimate sees. Building a model of L layers (its parameters' initialisers,
# traced by jit or eval_shape; the same for either form) takes time that
# grows as L**2: each random draw updates the Rngs' counter, and flax's
# update asks the traced counter for its sharding, whose error message walks
# the whole program traced so far: a build of a tiny model that takes
# seconds at 64 layers takes minutes at 256, and training builds it again and
# compiles it. An unrolled model (scan_layers=False) also
# compiles every layer as its own code, a scanned one compiles one layer.
# The paper's deepest model has 36 layers; the bounds below leave room
# above it and refuse, in a moment, what would build silently for minutes
# (num_layers=20000 or 2**31 - 1 on a model small enough to fit the memory).
MAX_UNROLLED_LAYERS = 64
MAX_LAYERS = 128


def _check_depth(cfg: ModelConfig) -> None:
  if not cfg.scan_layers and cfg.num_layers > MAX_UNROLLED_LAYERS:
    raise ConfigError(
      f"model.num_layers={cfg.num_layers} unrolled layers is more than {MAX_UNROLLED_LAYERS}, "
      "each compiled as its own code (minutes to build and compile): set "
      "model.scan_layers=True (one layer compiled, run by lax.scan) for a deeper model"
    )
  if cfg.num_layers > MAX_LAYERS:
    raise ConfigError(
      f"model.num_layers={cfg.num_layers} is more than {MAX_LAYERS} layers, which take "
      "minutes to build even scanned (the build's time grows as the layers squared)"
    )


def _check_rules(cfg: ModelConfig) -> None:
  """ConfigError naming the first rule between the fields (each field
  already checked against its own range) that `cfg` breaks."""
  if cfg.d_model % cfg.num_heads:
    raise ConfigError(
      f"model.d_model={cfg.d_model} is not divisible by model.num_heads={cfg.num_heads}"
    )
  # model.compression names a plugin: its registry checks the name
  # (compression.resolve, when the model is built; the experiment's check).
  if cfg.positions == "rope" and cfg.head_dim % 2:
    raise ConfigError(
      f"model.positions='rope' rotates channel pairs, so the head width must be even: "
      f"model.d_model / model.num_heads = {cfg.d_model} / {cfg.num_heads} = {cfg.head_dim}"
    )
  _check_depth(cfg)
  if cfg.attention_implementation == "cudnn" and cfg.positions != "rope":
    raise ConfigError(
      "model.attention_implementation='cudnn' needs model.positions='rope': only rotary "
      "attention is a plain dot product that a fused kernel can compute"
    )
  _check_needs_compressed_memory(cfg)
  check_memory_sizes(cfg, cfg.memory_length, cfg.compressed_memory_length)
  check_segment_length(cfg, cfg.segment_length, cfg.compressed_memory_length)


def _check_needs_compressed_memory(cfg: ModelConfig) -> None:
  """The choices that act on compressed slots, refused for a model without them."""
  if cfg.compressed_keys_values == "own" and not cfg.compressed_memory_length:
    raise ConfigError(
      "model.compressed_keys_values='own' needs a compressed memory "
      "(model.compressed_memory_length > 0): its projections read only compressed slots"
    )
  if cfg.memory_gradient == "compressor" and not cfg.compressed_memory_length:
    raise ConfigError(
      "model.memory_gradient='compressor' needs a compressed memory "
      "(model.compressed_memory_length > 0); a Transformer-XL's memories are reached with "
      "'memories'"
    )


def check_segment_length(
  cfg: ModelConfig,
  segment_length: int,
  compressed_memory_length: int,
  field: str = "model.segment_length",
) -> None:
  """A segment (training's, evaluation's or generation's) evicts as many
  memories as it has tokens, compressed in groups of compression_rate, and
  its queries attend in whole chunks of attention_chunk_size."""
  chunk = cfg.attention_chunk_size
  if chunk and segment_length % chunk:
    raise ConfigError(
      f"{field}={segment_length} is not a multiple of model.attention_chunk_size={chunk}: "
      "the segment's queries attend in whole chunks"
    )
  if compressed_memory_length and segment_length % cfg.compression_rate:
    raise ConfigError(
      f"{field}={segment_length} is not a multiple of model.compression_rate="
      f"{cfg.compression_rate}: each segment's evicted memories are compressed in "
      "groups of compression_rate"
    )


def check_memory_sizes(
  cfg: ModelConfig,
  memory_length: Any,
  compressed_memory_length: Any,
  batch_size: Any = 1,
  *,
  prefix: str = "model",
) -> None:
  """Checks memory sizes (training's or evaluation's) against the model."""
  for name, value in (
    ("memory_length", memory_length),
    ("compressed_memory_length", compressed_memory_length),
  ):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ConfigError(f"{prefix}.{name}={value!r} must be an integer >= 0")
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
  if compressed_memory_length and not memory_length:
    raise ConfigError(
      f"{prefix}.compressed_memory_length={compressed_memory_length} needs "
      f"{prefix}.memory_length > 0: only memories that leave the memory are compressed"
    )
  if compressed_memory_length and not cfg.compressed_memory_length:
    raise ConfigError(
      f"{prefix}.compressed_memory_length={compressed_memory_length} but the model was "
      "built with model.compressed_memory_length=0 (Transformer-XL): it has no compressor"
    )
