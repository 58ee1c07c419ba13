"""The tools run as modules of the installed package, from any directory:
`python -m compressive.train` finds the packaged config by name, trains, and
`python -m compressive.eval` evaluates what it saved; each root script of a
checkout is the same tool (the same flags and --help)."""

import json
import os
import sys

import pytest

from helpers import ROOT
import processes

# Slow (every test runs the tools in processes):
# `make test-fast` (pytest -m 'not slow') leaves this file out.
pytestmark = pytest.mark.slow


TIMEOUT = 600

# The default config made tiny on the command line: it is found by name.
TINY = [
  "--config=default",
  "--config.data.source=synthetic",
  "--config.data.synthetic.num_docs=(16,4,4)",
  "--config.model.num_layers=2",
  "--config.model.d_model=32",
  "--config.model.d_ff=64",
  "--config.model.num_heads=2",
  "--config.model.segment_length=8",
  "--config.model.memory_length=8",
  "--config.model.compressed_memory_length=4",
  "--config.batch_size=4",
  "--config.segments_per_step=2",
  "--config.optimizer.warmup_steps=1",
  "--config.log_every_steps=1",
  "--config.eval_every_steps=0",
  "--config.checkpoint_every_steps=3",
  "--config.num_train_steps=3",
]


def python(*args, cwd):
  # Without PYTHONPATH: the package is the installed one, wherever cwd is.
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  return processes.run(
    [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
  )


def test_train_then_eval_as_modules_from_another_directory(tmp_path):
  workdir = tmp_path / "wd"
  r = python("-m", "compressive.train", f"--workdir={workdir}", *TINY, cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert (workdir / "checkpoints" / "3").is_dir(), os.listdir(workdir / "checkpoints")
  r = python(
    "-m",
    "compressive.eval",
    f"--workdir={workdir}",
    "--split=test",
    "--max_segments=2",
    cwd=tmp_path,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["step"] == 3 and result["split"] == "test"
  assert 0 < result["bits_per_token"] < 20
  assert (workdir / "eval_test_step3.json").is_file()


# Three of the tools (a module, a package's __main__): tests/tools/test_architecture.py
# holds every root script to running its tool and nothing else.
@pytest.mark.parametrize("tool", ["train", "eval", "aot"])
def test_the_module_and_the_root_script_are_one_tool(tool, tmp_path):
  # absl heads the tool's own flags with the command's script: the module's
  # path or the root script's name; everything else is the same text.
  module = python("-m", f"compressive.{tool}", "--help", cwd=tmp_path)
  script = python(f"{tool}.py", "--help", cwd=ROOT)
  assert module.returncode == script.returncode == 0, module.stderr[-3000:]  # --help: exit 0
  path = "compressive/aot/__main__.py" if tool == "aot" else f"compressive/{tool}.py"
  header = next(line for line in module.stdout.splitlines() if line.endswith(f"{path}:"))
  assert f"\n{tool}.py:\n  --" in script.stdout
  assert module.stdout.replace(f"\n{header}\n", f"\n{tool}.py:\n") == script.stdout
