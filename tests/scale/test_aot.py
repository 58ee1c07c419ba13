"""aot.py: a config's steps compiled from shapes, with what one device holds.

TPU and GPU targets need the AOT environment (`make aot-venv`), which the test
suite does not install; here the CPU target runs the same code path (the
train step and evaluation step as training builds them, lowered from
shapes), and the parts that read compiler output are checked on real
samples of it.
"""

import json
import os
import sys

import pytest

from compressive import aot as aot_lib
from helpers import ROOT, process_env, write_config_file
import inprocess
import processes


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  return write_config_file(tmp_path_factory.mktemp("cfg") / "tiny.py")


def aot(*args, env=None):
  """aot.py in this process (tests/inprocess.py), or in a process of its own
  with an environment that changes how JAX starts (fake devices)."""
  if not inprocess.needs_a_process(env):
    return inprocess.run("aot.py", list(args), env=env)
  return processes.run(
    [sys.executable, os.path.join(ROOT, "aot.py"), *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )


@pytest.mark.slow
@pytest.mark.parametrize("step", ["train", "eval"])
def test_cpu_target_prints_one_json_report(config_file, step):
  r = aot(f"--config={config_file}", "--target=cpu", f"--step={step}")
  assert r.returncode == 0, r.stderr[-2000:]
  report = json.loads(r.stdout.strip().splitlines()[-1])
  assert {
    "target",
    "devices",
    "processes",
    "mesh",
    "compile_seconds",
    "per_device",
    "device_memory_bytes",
    "fits",
    "flops_per_step",
    "model_flops_per_step",
    "collectives",
  } <= set(report)
  per = report["per_device"]
  assert per["total"] == (
    per["arguments"] + per["outputs"] - per["aliased"] + per["temporaries"] + per["code"]
  )
  assert report["fits"] is True and report["target"] == "cpu" and report["step"] == step
  assert per["arguments"] > 0 and report["model_flops_per_step"] > 0
  assert "compiling" in r.stderr  # progress on stderr, the result alone on stdout


@pytest.mark.slow
def test_an_oversized_batch_exits_1_with_one_line(config_file):
  # 2**22 rows need far more than this machine's memory; compiling them
  # allocates nothing.
  r = aot(f"--config={config_file}", "--target=cpu", "--config.batch_size=4194304")
  assert r.returncode == 1, r.stderr[-2000:]
  errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in r.stderr
  assert "does not fit" in errors[0] and "GiB over" in errors[0] and "batch_size" in errors[0]


@pytest.mark.slow
def test_an_unknown_target_is_one_line_naming_the_known_ones(config_file):
  r = aot(f"--config={config_file}", "--target=tpu:v9-1")
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert "tpu:v9-1" in r.stderr and "tpu:v5e-8" in r.stderr


@pytest.mark.slow
def test_sharded_train_step_reports_its_collectives(config_file):
  # 8 fake CPU devices, parameters split 8 ways (FSDP): the step must gather
  # them and reduce their gradients.
  env = process_env(8)
  r = aot(
    f"--config={config_file}",
    "--target=cpu",
    "--config.mesh.shape=(1,8,1)",
    "--config.batch_size=8",
    env=env,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  report = json.loads(r.stdout.strip().splitlines()[-1])
  assert report["devices"] == 8 and report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
  assert report["collectives"].get("all-gather", 0) > 0
  assert (
    report["collectives"].get("all-reduce", 0) + report["collectives"].get("reduce-scatter", 0)
  ) > 0


def test_reading_compiler_output():
  text = """
  %ag = f32[8,16]{1,0} all-gather(f32[1,16]{1,0} %p), replica_groups={}
  %ars = (f32[4]{0}, f32[4]{0}) all-reduce-start(f32[4]{0} %x), to_apply=%add
  %ard = f32[4]{0} all-reduce-done((f32[4]{0}, f32[4]{0}) %ars)
  %rs = f32[2]{0} reduce-scatter(f32[16]{0} %y), dimensions={0}
  %fusion.3 = f32[4]{0} fusion(f32[4]{0} %all-gather.1), calls=%fused
  """
  assert aot_lib.collectives(text) == {"all-gather": 1, "all-reduce": 1, "reduce-scatter": 1}
  # libtpu 0.0.42's words for a program over a v5e chip's HBM.
  message = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (20.07G) exceeds available HBM (15.75G)."
  )
  need, have = aot_lib.parse_out_of_memory(message)
  assert abs(need / 1024**3 - 20.07) < 1e-9 and abs(have / 1024**3 - 15.75) < 1e-9
  assert aot_lib.parse_out_of_memory("INTERNAL: something else") is None
