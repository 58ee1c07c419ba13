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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  num_layers: int
  num_heads: int
  d_model: int
  d_ff: int
  segment_length: int
  memory_length: int
  compressed_memory_length: int
  compression_rate: int
  compression: str = "conv"
  reconstruction_loss: str = "attention"
  positions: str = "relative"  # relative (Transformer-XL) | rope (rotary)
  # NORMS: layer norm before each sublayer, or after its residual sum (the
  # paper's, and every shipped config's). "pre" here because a config saved
  # before the field existed (a workdir's config.json) was trained pre-norm.
  norm: str = "pre"
  dropout_rate: float = 0.0
  dtype: str = "float32"  # activations; parameters are always float32
  scan_layers: bool = False  # one stacked layer, run by lax.scan over the layer axis
  remat: str = "none"  # REMAT_POLICIES
  attention_chunk_size: int = 0  # queries per attention chunk; 0 = the whole segment
  attention_implementation: str = "auto"  # rope's fused attention: auto | xla | cudnn
  memory_gradient: str = "none"  # MEMORY_GRADIENTS; "none" is the paper's

  @classmethod
  def from_config(cls, config: Any) -> "ModelConfig":
    """From a ConfigDict / mapping (extra keys ignored) or a ModelConfig."""
    if isinstance(config, ModelConfig):
      return config
    if hasattr(config, "to_dict"):
      config = config.to_dict()
    if not isinstance(config, Mapping):
      raise ConfigError(f"model config must be a ConfigDict or mapping, got {type(config).__name__}")
    values = {}
    for f in dataclasses.fields(cls):
      if f.name in config:
        values[f.name] = config[f.name]
      elif f.default is dataclasses.MISSING:
        raise ConfigError(f"model.{f.name} is missing from the config")
    return cls(**values)

  def __post_init__(self):
    validate(self)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def temporal_range(self) -> int:
    """Tokens back one layer can reach: n_m + c * n_cm (paper §3)."""
    return self.memory_length + self.compression_rate * self.compressed_memory_length


def _int(cfg: ModelConfig, name: str, minimum: int) -> None:
  value = getattr(cfg, name)
  if isinstance(value, bool) or not isinstance(value, int):
    raise ConfigError(f"model.{name}={value!r} must be an integer")
  if value < minimum:
    raise ConfigError(f"model.{name}={value} must be >= {minimum}")


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
        "model.scan_layers=True (one layer compiled, run by lax.scan) for a deeper model")
  if cfg.num_layers > MAX_LAYERS:
    raise ConfigError(
        f"model.num_layers={cfg.num_layers} is more than {MAX_LAYERS} layers, which take "
        "minutes to build even scanned (the build's time grows as the layers squared)")


def validate(cfg: ModelConfig) -> None:
  """Raises ConfigError naming the first inconsistent field."""
  for name in ("vocab_size", "num_layers", "num_heads", "d_model", "d_ff",
               "segment_length", "compression_rate"):
    _int(cfg, name, 1)
  for name in ("memory_length", "compressed_memory_length"):
    _int(cfg, name, 0)
  if cfg.d_model % cfg.num_heads:
    raise ConfigError(
        f"model.d_model={cfg.d_model} is not divisible by model.num_heads={cfg.num_heads}")
  from compressive.model.attention import POSITIONS
  # model.compression names a plugin: its registry checks the name
  # (compression.resolve, when the model is built; the experiment's check).
  if cfg.reconstruction_loss not in RECONSTRUCTION_LOSSES:
    raise ConfigError(
        f"model.reconstruction_loss={cfg.reconstruction_loss!r} is unknown; choose one of "
        f"{', '.join(RECONSTRUCTION_LOSSES)}")
  if cfg.positions not in POSITIONS:
    raise ConfigError(
        f"model.positions={cfg.positions!r} is unknown; choose one of {', '.join(POSITIONS)}")
  if cfg.norm not in NORMS:
    raise ConfigError(f"model.norm={cfg.norm!r} is unknown; choose one of {', '.join(NORMS)}")
  if cfg.positions == "rope" and cfg.head_dim % 2:
    raise ConfigError(
        f"model.positions='rope' rotates channel pairs, so the head width must be even: "
        f"model.d_model / model.num_heads = {cfg.d_model} / {cfg.num_heads} = {cfg.head_dim}")
  values.number("model.dropout_rate", cfg.dropout_rate, "[0, 1)")  # as float32 holds it
  if cfg.dtype not in DTYPES:
    raise ConfigError(f"model.dtype={cfg.dtype!r} is unknown; choose one of {', '.join(DTYPES)}")
  if not isinstance(cfg.scan_layers, bool):
    raise ConfigError(f"model.scan_layers={cfg.scan_layers!r} must be True or False")
  _check_depth(cfg)
  if cfg.remat not in REMAT_POLICIES:
    raise ConfigError(
        f"model.remat={cfg.remat!r} is unknown; choose one of {', '.join(REMAT_POLICIES)}")
  _int(cfg, "attention_chunk_size", 0)
  from compressive.model.attention import IMPLEMENTATIONS
  if cfg.attention_implementation not in IMPLEMENTATIONS:
    raise ConfigError(
        f"model.attention_implementation={cfg.attention_implementation!r} is unknown; choose "
        f"one of {', '.join(IMPLEMENTATIONS)}")
  if cfg.attention_implementation == "cudnn" and cfg.positions != "rope":
    raise ConfigError(
        "model.attention_implementation='cudnn' needs model.positions='rope': only rotary "
        "attention is a plain dot product that a fused kernel can compute")
  _check_memory_gradient(cfg)
  check_memory_sizes(cfg, cfg.memory_length, cfg.compressed_memory_length)
  check_segment_length(cfg, cfg.segment_length, cfg.compressed_memory_length)


def _check_memory_gradient(cfg: ModelConfig) -> None:
  if cfg.memory_gradient not in MEMORY_GRADIENTS:
    raise ConfigError(f"model.memory_gradient={cfg.memory_gradient!r} is unknown; choose one of "
                      f"{', '.join(MEMORY_GRADIENTS)}")
  if cfg.memory_gradient == "compressor" and not cfg.compressed_memory_length:
    raise ConfigError(
        "model.memory_gradient='compressor' needs a compressed memory "
        "(model.compressed_memory_length > 0); a Transformer-XL's memories are reached with "
        "'memories'")


def check_segment_length(cfg: ModelConfig, segment_length: int, compressed_memory_length: int,
                         field: str = "model.segment_length") -> None:
  """A segment (training's, evaluation's or generation's) evicts as many
  memories as it has tokens, compressed in groups of compression_rate, and
  its queries attend in whole chunks of attention_chunk_size."""
  chunk = cfg.attention_chunk_size
  if chunk and segment_length % chunk:
    raise ConfigError(
        f"{field}={segment_length} is not a multiple of model.attention_chunk_size={chunk}: "
        "the segment's queries attend in whole chunks")
  if compressed_memory_length and segment_length % cfg.compression_rate:
    raise ConfigError(
        f"{field}={segment_length} is not a multiple of model.compression_rate="
        f"{cfg.compression_rate}: each segment's evicted memories are compressed in "
        "groups of compression_rate")


def check_memory_sizes(cfg: ModelConfig, memory_length: Any, compressed_memory_length: Any,
                       batch_size: Any = 1, *, prefix: str = "model") -> None:
  """Checks memory sizes (training's or evaluation's) against the model."""
  for name, value in (("memory_length", memory_length),
                      ("compressed_memory_length", compressed_memory_length)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ConfigError(f"{prefix}.{name}={value!r} must be an integer >= 0")
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
  if compressed_memory_length and not memory_length:
    raise ConfigError(
        f"{prefix}.compressed_memory_length={compressed_memory_length} needs "
        f"{prefix}.memory_length > 0: only memories that leave the memory are compressed")
  if compressed_memory_length and not cfg.compressed_memory_length:
    raise ConfigError(
        f"{prefix}.compressed_memory_length={compressed_memory_length} but the model was "
        "built with model.compressed_memory_length=0 (Transformer-XL): it has no compressor")
