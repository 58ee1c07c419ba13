"""Model FLOPs per token and the accelerators' peak rates: the training log's
MFU (model FLOPs utilisation) and the benchmarks' (benchmarks/common.py).

MFU = tokens per second x model FLOPs per token / (devices x peak FLOP/s of
one device). The peak is known only for the accelerators in `PEAK_TFLOPS`;
elsewhere (a CPU, an unlisted chip) there is no MFU: the benchmarks measure a
matmul rate instead (benchmarks/common.py `matmul_gflops`), which takes
seconds and is not done at a training run's start.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from compressive.model import compression as compression_lib
from compressive.model.config import ModelConfig


@dataclasses.dataclass
class Flops:
  """Model FLOPs per token, MaxText's way: matmuls only, 2 per multiply-add;
  training = forward + backward, where a weight's backward is 2x its forward
  (input and weight gradients) except where its input is stop-gradient
  (memory key/value projections, the compressor: weight gradient only);
  causal attention within the segment counted at half."""

  forward: float
  train: float
  evaluate: float  # forward with evaluation's key/value cache and position keys


def flops_per_token(model_config: ModelConfig, batch_size: int) -> Flops:
  """FLOPs per token of a model config, for rows processed `batch_size` at a
  time (the relative position keys are computed once per call, for all rows)."""
  m = model_config
  d, f, v, t = m.d_model, m.d_ff, m.vocab_size, m.segment_length
  mem, cmem, c = m.memory_length, m.compressed_memory_length, m.compression_rate
  keys = cmem + mem + t
  # Dense weights applied to the segment's tokens (fwd 2 flops per MAC).
  seg_weights = 2 * (
    d * d  # query
    + 2 * d * d  # key, value of the segment
    + d * d  # output
    + 2 * d * f
  )  # feed-forward
  # Keys and values of the memories (both banks), per segment token.
  mem_kv = 2 * 2 * d * d * (cmem + mem) / t
  # Relative position keys: W_r on `keys` sinusoids, once per segment for
  # all rows.
  pos = 2 * d * d * keys / (t * batch_size)
  # Attention: content logits, position logits, weighted values.
  attend = 3 * 2 * d * (cmem + mem + t / 2)
  # Compression: each compression declares its forward FLOPs per evicted
  # slot (model/compression.py), and a layer evicts t slots per segment.
  compress = compression_lib.declared_flops(m.compression, c, d) if cmem else 0
  # Reconstruction (training only): the segment's queries attend (content
  # logits + values) over the t evicted memories, whose keys and values the
  # layer's attention already computed (the target: forward only, no
  # gradient), and over the t / c compressed slots through frozen key/value
  # weights (the approximation: forward, then the gradient into the slots
  # and on to the compressor; none into the weights or the queries).
  if cmem and m.reconstruction_loss == "attention":
    target = 2 * 2 * d * t
    approx = 2 * 2 * d * t / c + 2 * 2 * d * d * (t / c) / t
    recon_train = target + 2 * approx
  else:
    recon_train = 0
  head = 2 * d * v
  layers = m.num_layers
  forward = layers * (seg_weights + mem_kv + pos + attend + compress) + head
  train = (
    layers * (3 * (seg_weights + pos + attend) + 2 * mem_kv + 2 * compress + recon_train) + 3 * head
  )
  # Evaluation's cache computes a slot's keys and values once: the segment's
  # (already in seg_weights) and those of the t / c new compressed slots.
  # Its position keys are computed once per stream, not per segment.
  cached_kv = 2 * 2 * d * d / c if cmem else 0
  evaluate = forward - layers * (mem_kv - cached_kv + pos)
  return Flops(forward=forward, train=train, evaluate=evaluate)


# Dense peak TFLOP/s of one device (one chip; a GPU), by a lowercase
# substring of `jax.Device.device_kind`, first match wins (so the more
# specific names come first): (bfloat16, float32). float32 is what XLA's
# default matmul precision runs float32 products at: TF32 tensor cores on
# A100 / H100 / H200, and the bfloat16 MXU passes on TPUs (whose float32
# entry is therefore the bfloat16 peak). Sources: the vendors' data sheets
# (NVIDIA SXM parts without sparsity; Google Cloud TPU system architecture).
# None: a kind whose name would otherwise match a longer one's entry.
PEAK_TFLOPS: tuple[tuple[str, Optional[tuple[float, float]]], ...] = (
  ("h200", (989.0, 494.5)),  # "NVIDIA H200"
  ("h100 pcie", (756.0, 378.0)),  # "NVIDIA H100 PCIe"
  ("h100", (989.0, 494.5)),  # "NVIDIA H100 80GB HBM3" (SXM)
  ("a100", (312.0, 156.0)),  # "NVIDIA A100-SXM4-80GB", "... PCIe"
  ("tpu v5 lite", (197.0, 197.0)),  # v5e
  ("tpu v5e", (197.0, 197.0)),
  ("tpu v5p", (459.0, 459.0)),
  ("tpu v5", (459.0, 459.0)),  # v5p reports "TPU v5"
  ("tpu v4 lite", None),  # v4i: not v4's peak
  ("tpu v4", (275.0, 275.0)),
)


def peak_flops(device_kind: str, dtype: jax.typing.DTypeLike) -> Optional[float]:
  """Peak FLOP/s of one device of `device_kind` computing in `dtype`
  (bfloat16 or float32; float16 counts as bfloat16); None when unknown."""
  kind = device_kind.lower()
  is_16 = jnp.dtype(dtype).itemsize <= 2
  for name, peaks in PEAK_TFLOPS:
    if name in kind:
      return None if peaks is None else peaks[0 if is_16 else 1] * 1e12
  return None


def device_peak_flops(
  dtype: jax.typing.DTypeLike, device: Optional[jax.Device] = None
) -> Optional[float]:
  """Peak FLOP/s of `device` (default: the first of `jax.devices()`)."""
  device = jax.devices()[0] if device is None else device
  return peak_flops(getattr(device, "device_kind", ""), dtype)
