"""NVIDIA GPUs as XLA's compiler needs them described: the published
specifications of each GPU model (GPU_SPECS), rendered as XLA's
GpuTargetConfigProto (gpu_target_config), for compressive/scale/targets.py's
GPU targets, compiled for on a host without a GPU.
"""

from __future__ import annotations

from typing import Any

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# Per compute capability: the CUDA C++ Programming Guide, "Compute
# Capabilities", Table "Technical Specifications per Compute Capability"
# (columns 8.0 and 9.0). Shared memory: 48 KiB a block without opting in;
# "maximum amount of shared memory per SM" 164 KB (8.0) / 228 KB (9.0);
# "maximum amount of shared memory per thread block" 163 KB / 227 KB (the
# opt-in limit, cudaFuncAttributeMaxDynamicSharedMemorySize). KB there is KiB.
_SM80_LIMITS = dict(
  threads_per_warp=32,  # "warp size"
  threads_per_block_limit=1024,  # "max threads per block"
  threads_per_core_limit=2048,  # "max resident threads per SM"
  registers_per_core_limit=64 * KiB,  # "32-bit registers per SM"
  registers_per_block_limit=64 * KiB,  # "32-bit registers per block"
  shared_memory_per_block=48 * KiB,
  shared_memory_per_block_optin=163 * KiB,
  shared_memory_per_core=164 * KiB,
  block_dim_limit_x=2**31 - 1,  # "max x-dimension of a grid"
  block_dim_limit_y=65535,  # "max y- or z-dimension of a grid"
  block_dim_limit_z=65535,
  thread_dim_limit_x=1024,  # "max x- or y-dimension of a block"
  thread_dim_limit_y=1024,
  thread_dim_limit_z=64,  # "max z-dimension of a block"
)
_COMPUTE_CAPABILITY_LIMITS = {
  (8, 0): _SM80_LIMITS,
  # 9.0 differs from 8.0 only in shared memory.
  (9, 0): dict(
    _SM80_LIMITS, shared_memory_per_block_optin=227 * KiB, shared_memory_per_core=228 * KiB
  ),
}

# Per GPU model. Sources:
#   [A100-WP] NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020),
#             "A100 SXM4": 108 SMs, 64 FP32 cores / SM, 40 MB L2, boost
#             clock 1410 MHz.
#   [A100-DS] NVIDIA A100 Tensor Core GPU datasheet, "A100 80GB SXM": 80 GB
#             HBM2e, 2,039 GB/s, BF16 tensor core 312 TFLOPS (624 sparse).
#   [H100-WP] NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022),
#             "H100 SXM5": 132 SMs, 128 FP32 cores / SM, 50 MB L2.
#   [H100-DS] NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM": 80 GB HBM3,
#             3.35 TB/s, BF16 tensor core 1,979 TFLOPS with sparsity, i.e.
#             989 TFLOPS dense.
#   [H200-DS] NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM": 141 GB
#             HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS with sparsity (989 dense);
#             the same GH100 chip as H100 SXM5 (132 SMs, 50 MB L2).
#   [CLOCK]   clock_rate_ghz is the SM's maximum clock as CUDA reports it
#             (cudaDevAttrClockRate): 1980 MHz for GH100 SXM parts, 1410 MHz
#             for A100 SXM4. The datasheets' tensor-core TFLOPS are at the
#             sustained boost: 132 SMs x 4 tensor cores x 1024 bf16 flop per
#             clock x 1.83 GHz = 989 TFLOPS; A100: 108 x 4 x 512 x 1.41 GHz
#             = 312 TFLOPS.
# The datasheets' "GB" of HBM is taken as GiB (HBM stacks come in binary
# sizes: 5 x 16 GiB on H100 and A100 80GB). What CUDA reports as a device's
# total is a little less after the driver's reservations (nvidia-smi shows
# about 79.6 GiB on an H100 80GB, 140.4 GiB on an H200), and JAX preallocates
# 75% of it by default (XLA_PYTHON_CLIENT_MEM_FRACTION): budget below
# device_memory_size.
# name: the device name CUDA reports (cudaDeviceProp.name; JAX's
# device_kind); XLA compares it when loading a serialized executable.
GPU_SPECS: dict[str, dict[str, Any]] = {
  "a100-sxm4-80gb": dict(
    name="NVIDIA A100-SXM4-80GB",
    compute_capability=(8, 0),
    accelerated_features=False,  # sm_80 has no "a" variant
    core_count=108,  # SMs [A100-WP]
    fpus_per_core=64,  # FP32 cores per SM [A100-WP]
    clock_rate_ghz=1.41,  # [A100-WP], [CLOCK]
    device_memory_size=80 * GiB,  # [A100-DS]
    memory_bandwidth=2_039_000_000_000,  # bytes/s [A100-DS]
    l2_cache_size=40 * MiB,  # [A100-WP]
  ),
  "h100-sxm": dict(
    name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    # sm_90a: wgmma/TMA instructions, which XLA's and Triton's Hopper
    # kernels use; CUDA reports H100 as 9.0 with these features.
    accelerated_features=True,
    core_count=132,  # [H100-WP]
    fpus_per_core=128,  # [H100-WP]
    clock_rate_ghz=1.98,  # [CLOCK]
    device_memory_size=80 * GiB,  # [H100-DS]
    memory_bandwidth=3_350_000_000_000,  # [H100-DS]
    l2_cache_size=50 * MiB,  # [H100-WP]
  ),
  "h200-sxm": dict(
    name="NVIDIA H200",
    compute_capability=(9, 0),
    accelerated_features=True,
    core_count=132,  # [H200-DS], [H100-WP]
    fpus_per_core=128,  # [H100-WP]
    clock_rate_ghz=1.98,  # [CLOCK]
    device_memory_size=141 * GiB,  # [H200-DS]
    memory_bandwidth=4_800_000_000_000,  # [H200-DS]
    l2_cache_size=50 * MiB,  # [H100-WP]
  ),
}

# cuDNN version written into the target config when nvidia-cudnn-cu12 is not
# installed (requirements-aot.txt pins it): XLA decides from it which cuDNN
# features (fused attention, ...) it may use, so it should be the cuDNN of
# the machines that run the result.
_DEFAULT_CUDNN_VERSION = (9, 28, 0)


def _cudnn_version() -> tuple[int, int, int]:
  """The installed nvidia-cudnn-cu12's version (without loading it)."""
  from importlib import metadata

  try:
    parts = metadata.version("nvidia-cudnn-cu12").split(".")
    return int(parts[0]), int(parts[1]), int(parts[2])
  except (metadata.PackageNotFoundError, ValueError, IndexError):
    return _DEFAULT_CUDNN_VERSION


def gpu_target_config(gpu: str) -> str:
  """`GpuTargetConfigProto` in protobuf text form for GPU_SPECS[gpu].

  Field names: xla/stream_executor/device_description.proto (the descriptor
  inside jaxlib 0.10.2 and jax-cuda12-plugin 0.10.2 agree), package
  stream_executor: GpuTargetConfigProto{gpu_device_info, platform_name,
  dnn_version_info, device_description_str}.
  """
  spec = GPU_SPECS[gpu]
  major, minor = spec["compute_capability"]
  info = dict(_COMPUTE_CAPABILITY_LIMITS[(major, minor)])
  for key in (
    "core_count",
    "fpus_per_core",
    "clock_rate_ghz",
    "device_memory_size",
    "memory_bandwidth",
    "l2_cache_size",
  ):
    info[key] = spec[key]
  lines = ["gpu_device_info {"]
  lines += [f"  {key}: {value}" for key, value in info.items()]
  extension = "ACCELERATED_FEATURES" if spec["accelerated_features"] else "NONE"
  lines += [
    "  cuda_compute_capability {",
    f"    major: {major}",
    f"    minor: {minor}",
    f"    feature_extension: {extension}",
    "  }",
    '  device_vendor: "NVIDIA Corporation"',
    f'  name: "{spec["name"]}"',
    "}",
    'platform_name: "CUDA"',
  ]
  dnn = _cudnn_version()
  lines += [
    "dnn_version_info {",
    f"  major: {dnn[0]}",
    f"  minor: {dnn[1]}",
    f"  patch: {dnn[2]}",
    "}",
  ]
  lines.append(f'device_description_str: "{spec["name"]}"')
  return "\n".join(lines) + "\n"
