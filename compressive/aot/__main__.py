"""Compile a config's train or evaluation step for hardware this machine does
not have, and say whether it fits: python -m compressive.aot --config=C --target=T.

    python -m compressive.aot --config=tpu_v5e8:pg19 --target=tpu:v5e-8
    python -m compressive.aot --config=gpu8:enwik8 --target=gpu:h200-8 --step=eval
    python -m compressive.aot --config=pg19 --target=cpu      # this machine's devices

The step is the one train.py (or eval.py) runs, built from shapes alone for
the target's devices (compressive/scale/targets.py: TPU topologies and CUDA
targets, compiled for on a CPU host). Progress goes to stderr; the last line
of stdout is one JSON object: target, devices, processes, mesh,
compile_seconds, per_device bytes (arguments, outputs, aliased, temporaries,
code, total), device_memory_bytes, fits, flops_per_step (XLA's, all devices),
model_flops_per_step (ours), step_seconds_at_40pct_mfu and collectives (by
kind; one inside a loop counts once).

Exit 0 when the step fits in the device's memory; 1, with one line saying by
how much it is over and what to change, when it does not; 2 for a bad flag
or config. TPU and GPU targets need the AOT environment (`make aot-venv`,
then `.venv-aot/bin/python aot.py ...`); `--target=cpu` runs anywhere. The
persistent compilation cache is off, so compile_seconds is a real compile.
"""

import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

from absl import flags
from absl import logging as absl_logging
import jax

from compressive import cli
from compressive import config as config_lib
from compressive import experiment as experiment_lib
from compressive.errors import DoesNotFitError

if TYPE_CHECKING:
  from compressive.aot import Report
  from compressive.scale import targets

# Before JAX starts a backend: compile on this host's CPU client; the TPU and
# GPU compilers are reached through their topologies
# (compressive/scale/targets.py). JAX is imported by now (the package is), so
# its own setting is changed, unless JAX_PLATFORMS chose otherwise.
if not os.environ.get("JAX_PLATFORMS"):
  jax.config.update("jax_platforms", "cpu")

FLAGS = flags.FLAGS


def define_flags() -> None:
  """aot.py's flags, defined by the tool alone (`python -m compressive.aot`):
  importing the module for `run` defines none."""
  cli.define_config_flag(default="default.py")
  flags.DEFINE_string(
    "target",
    "cpu",
    "What to compile for: cpu, tpu:v5e-8, gpu:h200-8, ... "
    "(compressive/scale/targets.py; --target=list names them all).",
  )
  flags.DEFINE_enum(
    "step",
    "train",
    ["train", "eval"],
    "The train step (segments_per_step updates) or one evaluation segment.",
  )


def _say(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _compile_with_progress(
  lowered: jax.stages.Lowered, what: str
) -> tuple[jax.stages.Compiled, float]:
  """lowered.compile(), printing a line to stderr every 30 s meanwhile."""
  done = threading.Event()
  start = time.perf_counter()

  def tick() -> None:
    while not done.wait(30.0):
      _say(f"  still compiling {what} ({time.perf_counter() - start:.0f} s)")

  threading.Thread(target=tick, daemon=True).start()
  try:
    return lowered.compile(), time.perf_counter() - start
  finally:
    done.set()


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  absl_logging.set_verbosity(absl_logging.WARNING)  # not JAX's INFO lines about absent backends
  with cli.user_errors():
    sys.exit(run(FLAGS.config, FLAGS.target, FLAGS.step))


def _check(
  config: Any, step: str, target: "targets.Target", num_devices: int
) -> experiment_lib.Experiment:
  """The config for `target`, its size estimated against the target's memory
  before the model is built: a config whose shapes alone exceed it does not
  fit, said at once (exit 1, as for a compiled step that does not fit)."""
  try:
    return config_lib.check(
      config,
      training=step == "train",
      num_devices=num_devices,
      capacity=(target.device_memory_bytes, f"{target.name}'s memory per device"),
    )
  except DoesNotFitError as e:
    cli.fail(
      f"the {step} step for {target.name} does not fit: {e} "
      f"({(e.need - e.have) / 2**30:.2f} GiB over, estimated before compiling)",
      code=1,
    )


def run(config: Any, target_name: str, step: str) -> int:
  from compressive.scale import targets

  if target_name == "list":
    print("\n".join(targets.TARGETS))
    return 0
  targets.prepare_environment()
  target = targets.get(target_name)
  import jax

  jax.config.update("jax_enable_compilation_cache", False)
  from compressive import aot as aot_lib
  from compressive.scale import flops, sharding

  devices = target.devices()
  what = f"the {step} step for {target.name}"
  experiment = _check(config, step, target, len(devices))
  mesh = sharding.make_mesh(experiment.mesh, devices)
  _say(f"lowering {what}: {len(devices)} {devices[0].device_kind} devices, mesh {dict(mesh.shape)}")
  start = time.perf_counter()
  lower = aot_lib.lower_train_step if step == "train" else aot_lib.lower_eval_step
  lowered = lower(experiment, mesh)
  _say(f"lowered in {time.perf_counter() - start:.1f} s; compiling")
  compiled, seconds = _compile_or_fail(lowered, what, experiment, step)
  _say(f"compiled in {seconds:.1f} s")
  result = aot_lib.report(
    compiled,
    target=target.name,
    step=step,
    devices=devices,
    mesh=mesh,
    compile_seconds=seconds,
    device_memory_bytes=target.device_memory_bytes,
    peak_flops_per_device=None
    if target.platform == "cpu"
    else flops.peak_flops(devices[0].device_kind, "bfloat16"),
    experiment=experiment,
  )
  print(json.dumps(result.as_dict(), allow_nan=False))
  if result.fits is False:
    _fail_too_big(what, result, experiment, step)
  return 0


def _compile_or_fail(
  lowered: jax.stages.Lowered, what: str, experiment: experiment_lib.Experiment, step: str
) -> tuple[jax.stages.Compiled, float]:
  """(compiled, seconds) of _compile_with_progress; exit 1 when the TPU
  compiler refuses the step's temporaries as more than a device holds (by
  how much, and what to change)."""
  from compressive import aot as aot_lib

  try:
    return _compile_with_progress(lowered, what)
  except Exception as e:
    over = aot_lib.parse_out_of_memory(str(e))
    if over is None:
      raise
    need, have = over
    cli.fail(
      f"{what} does not fit: the TPU compiler counts {need / aot_lib.GIB:.2f} GiB of "
      f"temporaries per device, {(need - have) / aot_lib.GIB:.2f} GiB over the "
      f"{have / aot_lib.GIB:.2f} GiB there is; "
      f"{aot_lib.advice(experiment, step)}",
      code=1,
    )


def _fail_too_big(
  what: str, result: "Report", experiment: experiment_lib.Experiment, step: str
) -> NoReturn:
  """Exit 1 for a compiled step whose `result` does not fit."""
  from compressive import aot as aot_lib

  total, have = result.per_device["total"], result.device_memory_bytes
  assert have is not None  # fits is False only against a known capacity
  cli.fail(
    f"{what} does not fit: it needs {total / aot_lib.GIB:.2f} GiB per device, "
    f"{(total - have) / aot_lib.GIB:.2f} GiB over the {have / aot_lib.GIB:.2f} GiB "
    f"there is; {aot_lib.advice(experiment, step, result.per_device)}",
    code=1,
  )


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__)
