"""Ahead-of-time compilation targets: TPU slices and GPU clusters, described
well enough for XLA to compile for them on a host that has neither.

    target = targets.get("tpu:v5e-8")   # or targets.TARGETS["tpu:v5e-8"]
    mesh = jax.make_mesh((8,), ("data",), devices=target.devices())
    jax.jit(f, in_shardings=..., out_shardings=...).lower(*shapes).compile()

`Target.devices()` returns compile-only devices (they run nothing; `.compile()`
and the compiled object's `memory_analysis()` work), made by
`jax.experimental.topologies.get_topology_desc`:

  tpu  libtpu's TPU compiler, from `jax[tpu]` (brings `libtpu`), given a
       slice's topology (chips along x, y[, z]; chips per host);
  gpu  the CUDA 12 PJRT plugin (`jax-cuda12-pjrt`, with `jax-cuda12-plugin`;
       with JAX 0.11 the CUDA 13 one, `jax-cuda13-plugin`, is taken too),
       given a `GpuTargetConfigProto` (the GPU's description, rendered by
       compressive/scale/gpu_specs.py from NVIDIA's published specifications)
       and a topology "<NVLink domains>x<hosts per domain>x<GPUs per host>";
  cpu  this process's own CPU devices (`jax.devices("cpu")`), no extra
       package.

Neither libtpu nor the CUDA plugin is imported here at import time: only
`devices()` of a tpu or gpu target loads them, and a missing one is a
ConfigError that names the `aot` extra of the package (`pip install
"compressive[aot]"`: jax[tpu,cuda12], which brings libtpu, the CUDA 12 plugin,
its compiler and cuDNN) and, in a checkout, `make aot-venv`
(requirements-aot.txt, .venv-aot).

Environment: `prepare_environment()` (which `Target.devices()` calls first)
sets these with os.environ.setdefault, so a value the user set wins. Each
matters only before the plugin concerned initialises, i.e. before jax first
initialises its backends (any jax.devices(), jit or array) - so a program
that touches jax before asking for a target's devices calls
`prepare_environment()` first, at start-up:

  JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (where a jax CUDA plugin is installed):
      the plugin otherwise runs a CUDA version check at jax's first backend
      initialisation, which fails on a host without a CUDA runtime and driver,
      and then never registers, leaving no GPU topology to compile for.
      (JAX_PLATFORMS=cpu skips that check too, and also keeps jax from trying
      the tpu and cuda backends for ordinary arrays: the quietest setting for
      a compile-only run.)
  TPU_WORKER_HOSTNAMES=localhost, TPU_HOST_BOUNDS=1,1,1 (where libtpu is
      installed and this host has no TPU chips): libtpu reads them when it
      loads; unset, it prints two harmless messages on a TPU-less host
      ("Failed to find host bounds for accelerator type: WARNING: could not
      determine TPU accelerator type..." and "E... INVALID_ARGUMENT: Error:
      unexpected worker hostname..."). They describe the host's own (absent)
      TPUs, not the compile target, whose topology is passed explicitly.

Per-device numbers (memory; peak FLOP/s live in compressive/scale/flops.py)
are the vendors' published ones (TPU memory: what the TPU compiler allows);
each carries its source.

What differs between the back ends (jax 0.10.2, libtpu 0.0.42.1):
  - `compiled.cost_analysis()` is a dict on cpu and tpu, None on gpu (as is
    `lowered.cost_analysis()`). XLA's HLO cost analysis of the compiled GPU
    module can be had from the CPU backend:
    `jax._src.lib.xla_client._xla.hlo_module_cost_analysis(
        jax._src.xla_bridge.get_backend("cpu"),
        compiled.runtime_executable().hlo_modules()[0])`.
  - A program too big for a TPU chip fails to compile (RESOURCE_EXHAUSTED,
    "... exceeds available HBM (15.75G)"); the GPU compiler compiles it and
    only logs that arguments exceed its scheduling limit: compare
    `memory_analysis()` with `device_memory_bytes` yourself.
  - jax.nn.dot_product_attention(..., implementation="cudnn") checks the
    compute capability of the *local* GPU while tracing; with none (this
    host) it takes the pre-Hopper limits, so head dimensions over 128 are
    refused even for H100/H200 targets. cuDNN builds its attention graph
    when the program first runs, so compiling does not prove that cuDNN
    accepts the configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from typing import Optional, Union

from compressive.errors import ConfigError
from compressive.scale.gpu_specs import GPU_SPECS, GiB, gpu_target_config

# What a missing libtpu or CUDA plugin's error advises.
AOT_ADVICE = (
  'install the AOT extra, pip install "compressive[aot]" (in a checkout: '
  "`make aot-venv`, then run with .venv-aot/bin/python)"
)


def _installed(module: str) -> bool:
  """Whether `module` can be imported (without importing it)."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # a parent package is missing
    return False


# --------------------------------------------------------------------------
# Targets.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TpuTopology:
  """Arguments of get_topology_desc(platform="tpu", ...) (libtpu's names)."""

  topology_name: str  # "<chip>:<chips along x>x<y>[x<z>]", e.g. "v5e:2x4"
  chips_per_host_bounds: tuple[int, int, int]  # one host's chips along x,y,z
  wrap: tuple[bool, bool, bool] = (False, False, False)  # torus links
  num_slices: int = 1
  chip_config_name: str = "default"


@dataclasses.dataclass(frozen=True)
class GpuTopology:
  """Arguments of get_topology_desc(platform="cuda", ...)."""

  gpu: str  # a key of GPU_SPECS
  # XLA's TopologySizes: "<slices>x<hosts per slice>x<devices per host>",
  # where a slice is the devices joined by NVLink. An HGX/DGX node's NVLink
  # stops at the node, so N such nodes are N slices of one host ("Nx1x8");
  # "1x2x8" would be one NVLink domain over two hosts (GB200 NVL-style).
  num_slices: int
  hosts_per_slice: int
  devices_per_host: int

  @property
  def topology(self) -> str:
    return f"{self.num_slices}x{self.hosts_per_slice}x{self.devices_per_host}"


@dataclasses.dataclass(frozen=True)
class Target:
  """Hardware to compile for.

  name: "cpu", "tpu:v5e-8", "gpu:h100-8x2", ...
  platform: "cpu", "tpu" or "gpu" (as the devices' .platform says).
  num_devices: JAX devices in all (one per TPU chip for v5e and v5p, whose
      two v5p TensorCores form one device; one per GPU). None in
      TARGETS["cpu"]: that is this process's count, which get("cpu") fills in.
  num_processes: hosts (JAX processes) the devices are spread over.
  device_memory_bytes: memory per device (HBM; for "cpu" the host's RAM,
      which its CPU devices share).
  Peak FLOP/s are not repeated here: compressive/scale/flops.py has them by the
  devices' kind.
  """

  name: str
  platform: str
  num_devices: Optional[int]
  num_processes: int
  device_memory_bytes: int
  description: str = ""
  topology: Union[TpuTopology, GpuTopology, None] = dataclasses.field(default=None, repr=False)

  def devices(self) -> list:
    """The jax devices to compile for (see the module docstring)."""
    prepare_environment()
    if self.platform == "cpu":
      import jax

      return list(jax.devices("cpu"))
    devices = list(_topology_devices(self.name, self.topology))
    processes = {d.process_index for d in devices}
    if len(devices) != self.num_devices or len(processes) != self.num_processes:
      raise AssertionError(
        f"target {self.name}: the topology gives {len(devices)} devices on "
        f"{len(processes)} processes, the table says {self.num_devices} on "
        f"{self.num_processes}"
      )
    return devices


@functools.lru_cache(maxsize=None)
def _topology_devices(name: str, topology: Union[TpuTopology, GpuTopology]) -> tuple:
  """Compile-only devices of a TPU or GPU topology (cached: libtpu and the
  CUDA plugin build the same devices each time, and holding on to one set
  keeps meshes over them comparable)."""
  from jax.experimental import topologies

  if isinstance(topology, TpuTopology):
    if not _installed("libtpu") and not os.environ.get("TPU_LIBRARY_PATH"):
      raise ConfigError(
        f"target {name} needs libtpu (jax[tpu]), which is not installed: " + AOT_ADVICE
      )
    topo = topologies.get_topology_desc(
      platform="tpu",
      topology_name=topology.topology_name,
      chip_config_name=topology.chip_config_name,
      chips_per_host_bounds=topology.chips_per_host_bounds,
      num_slices=topology.num_slices,
      wrap=topology.wrap,
    )
    return tuple(topo.devices)

  if not _cuda_plugin():
    raise ConfigError(
      f"target {name} needs jax's CUDA plugin (jax-cuda12-plugin, or jax-cuda13-plugin with "
      "JAX 0.11), which is not installed: " + AOT_ADVICE
    )
  try:
    topo = topologies.get_topology_desc(
      platform="cuda",
      topology_name="",
      target_config=gpu_target_config(topology.gpu),
      topology=topology.topology,
    )
  except NotImplementedError as e:
    # The plugin did not register: jax initialised its backends (and ran
    # the plugin's CUDA version check) before prepare_environment() set
    # JAX_SKIP_CUDA_CONSTRAINTS_CHECK.
    raise ConfigError(
      f"target {name}: jax's CUDA plugin did not register ({e}); set "
      "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 in the environment, or call "
      "compressive.scale.targets.prepare_environment() before anything else "
      "uses jax"
    ) from e
  return tuple(topo.devices)


def _cuda_plugin() -> bool:
  """Whether a CUDA plugin of jax is installed (CUDA 12 with JAX 0.10, 12 or
  13 with JAX 0.11)."""
  return _installed("jax_plugins.xla_cuda12") or _installed("jax_plugins.xla_cuda13")


def prepare_environment() -> None:
  """Sets, where unset, the variables that let jax's TPU and GPU compilers run
  quietly on this host (see the module docstring). Call it before anything
  initialises jax's backends; Target.devices() calls it too."""
  if _cuda_plugin():
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  if _installed("libtpu"):
    try:
      from jax._src import hardware_utils

      num_chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
    except Exception:  # a private API: stay out of the way if it changed
      return
    if num_chips == 0:
      os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
      os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
      # libtpu takes a lock (/tmp/libtpu_lockfile) so that one process owns
      # the host's TPUs, and a second aot.py would stop with an error. There
      # are none here to own: compiling only, any number may run at once.
      os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _host_memory_bytes() -> int:
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# TPU per-chip numbers. Peak: Cloud TPU documentation, "TPU v5e" / "TPU v5p"
# system architecture: v5e 197 TFLOPS bf16 (16 GiB HBM2e, one TensorCore),
# v5p 459 TFLOPS bf16 (95 GB HBM2e, two TensorCores as one megacore device).
# Memory: what the TPU compiler (libtpu 0.0.42.1) says it may use, from its
# RESOURCE_EXHAUSTED message ("... exceeds available HBM (15.75G)" for a v5e
# chip, "(95.74G)" for a v5p chip; G is GiB there): the largest f32 array a
# v5e chip compiles for is ~15.747 GiB, so 15.75 GiB includes the program.
# Slices and hosts (Cloud TPU docs, v5e/v5p "configurations"): v5litepod-8 is
# one host of 8 chips (2x4); larger v5e slices use hosts of 4 chips (2x2), so
# v5litepod-32 (4x8) has 8 hosts; v5p hosts have 4 chips (2x2x1), so v5p-8
# (8 TensorCores = 4 chips, 2x2x1) is one host. None of these slices has
# wraparound links (v5e's torus is the full 16x16 pod; v5p's needs full
# 4-chip cube dimensions).
_V5E_HBM = int(15.75 * GiB)
_V5P_HBM = int(95.74 * GiB)

_TARGET_LIST = [
  Target("cpu", "cpu", None, 1, _host_memory_bytes(), "this process's CPU devices"),
  Target(
    "tpu:v5e-8",
    "tpu",
    8,
    1,
    _V5E_HBM,
    "TPU v5e (v5litepod-8): 2x4 chips, one host",
    TpuTopology("v5e:2x4", (2, 4, 1)),
  ),
  Target(
    "tpu:v5e-32",
    "tpu",
    32,
    8,
    _V5E_HBM,
    "TPU v5e (v5litepod-32): 4x8 chips, 8 hosts of 2x2",
    TpuTopology("v5e:4x8", (2, 2, 1)),
  ),
  Target(
    "tpu:v5p-8",
    "tpu",
    4,
    1,
    _V5P_HBM,
    "TPU v5p-8: 2x2x1 chips (8 TensorCores), one host",
    TpuTopology("v5p:2x2x1", (2, 2, 1)),
  ),
]
for _gpu, _label in (("h100-sxm", "h100"), ("h200-sxm", "h200"), ("a100-sxm4-80gb", "a100")):
  _spec = GPU_SPECS[_gpu]
  for _n in (1, 8):  # one GPU (configs/gpu1.py), one node of 8 (gpu8.py)
    _TARGET_LIST.append(
      Target(
        f"gpu:{_label}-{_n}",
        "gpu",
        _n,
        1,
        _spec["device_memory_size"],
        f"{_spec['name']} x{_n}, one node",
        GpuTopology(_gpu, 1, 1, _n),
      )
    )
for _gpu, _label in (("h100-sxm", "h100"), ("h200-sxm", "h200")):
  _spec = GPU_SPECS[_gpu]
  _TARGET_LIST.append(
    Target(
      f"gpu:{_label}-8x2",
      "gpu",
      16,
      2,
      _spec["device_memory_size"],
      f"{_spec['name']} x8, two nodes (NVLink within each)",
      GpuTopology(_gpu, 2, 1, 8),
    )
  )

TARGETS: dict[str, Target] = {t.name: t for t in _TARGET_LIST}
del _gpu, _label, _spec, _n


def get(name: str) -> Target:
  """TARGETS[name] ("cpu" with its device count filled in)."""
  if name not in TARGETS:
    raise ConfigError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
  target = TARGETS[name]
  if target.platform == "cpu":
    target = dataclasses.replace(target, num_devices=len(target.devices()))
  return target
