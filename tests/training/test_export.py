"""export.py: a parameters-only copy of a checkpoint that `compressive.load`
reads back as the same model, a third of the checkpoint's size; every mistake
is one line and exit code 2."""

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.errors import CheckpointError
from compressive.training import exporting
from compressive.training import loop as train_lib
from helpers import tiny_experiment, to_train, write_config_file
import inprocess
import processes

# Slow (every test runs export.py on a model trained end to end): `make
# test-fast` (pytest -m 'not slow') leaves this file out.
pytestmark = pytest.mark.slow


def run_export(*args, cwd):
  """export.py in this process, as `python export.py` runs it (tests/inprocess.py)."""
  return inprocess.run("export.py", list(args), cwd=cwd)


def folder_bytes(path) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("export") / "wd")
  train_lib.train_and_evaluate(
    to_train(
      tiny_experiment(
        num_train_steps=4, checkpoint_every_steps=2, eval_every_steps=0, log_every_steps=2
      )
    ),
    path,
  )
  return path


@pytest.fixture(scope="module")
def exported(workdir, tmp_path_factory):
  """The newest checkpoint exported by export.py, run from another directory."""
  elsewhere = tmp_path_factory.mktemp("elsewhere")
  r = run_export(f"--workdir={workdir}", "--output=out", cwd=elsewhere)
  assert r.returncode == 0, r.stderr[-3000:]
  line = json.loads(r.stdout.strip().splitlines()[-1])
  assert line["step"] == 4 and line["output"] == "out"
  return str(elsewhere / "out")


def logits(model, config):
  tokens = jax.random.randint(
    jax.random.PRNGKey(1), (2, config.model.segment_length), 0, config.model.vocab_size
  )
  memory = compressive.init_memory(compressive.ModelConfig.from_config(config.model), batch_size=2)
  out, _, _ = model(tokens, memory, jnp.array([True, True]))
  return np.asarray(out)


def test_export_loads_as_the_same_model(workdir, exported):
  config_a, model_a = compressive.load(workdir)
  config_b, model_b, step = compressive.load_with_step(exported)
  assert step == 4
  assert config_b.to_dict() == config_a.to_dict()
  np.testing.assert_array_equal(logits(model_b, config_b), logits(model_a, config_a))


def test_export_is_a_third_of_the_checkpoint(workdir, exported):
  assert sorted(os.listdir(exported)) == ["config.json", "export.json", "params"]
  checkpoint = folder_bytes(os.path.join(workdir, "checkpoints", "4"))
  # Parameters only: Adam's two moments, the memory and the data position stay behind.
  assert folder_bytes(exported) < 0.5 * checkpoint, (folder_bytes(exported), checkpoint)


def test_export_of_an_older_step_into_an_empty_folder(workdir, tmp_path):
  out = tmp_path / "empty"
  out.mkdir()
  assert exporting.export(workdir, str(out), step=2) == 2
  config, model, step = compressive.load_with_step(str(out))
  _, original = compressive.load(workdir, 2)
  assert step == 2
  np.testing.assert_array_equal(logits(model, config), logits(original, config))
  with pytest.raises(CheckpointError, match="export of step 2 only"):
    compressive.load(str(out), 4)
  assert not [name for name in os.listdir(tmp_path) if ".partial-" in name]


def test_damaged_export_is_refused(exported, tmp_path):
  import shutil

  copy = tmp_path / "copy"
  shutil.copytree(exported, copy)
  files = [os.path.join(d, f) for d, _, fs in os.walk(copy / "params") for f in fs]
  largest = max(files, key=os.path.getsize)  # the arrays' data
  with open(largest, "r+b") as f:
    f.seek(os.path.getsize(largest) // 2)
    chunk = f.read(64)
    f.seek(-len(chunk), os.SEEK_CUR)
    f.write(bytes(b ^ 0xFF for b in chunk))
  with pytest.raises(CheckpointError, match=f"export {copy} is damaged"):
    compressive.load(str(copy))
  (copy / "export.json").write_text("{")
  with pytest.raises(CheckpointError, match="export.json is damaged"):
    compressive.load(str(copy))


@pytest.mark.parametrize(
  "args,message",
  [
    (["--output={tmp}/o"], "--workdir is required"),
    (["--workdir={wd}"], "--output is required"),
    (["--workdir={tmp}/nowhere", "--output={tmp}/o"], "is not a training workdir"),
    (["--workdir={wd}", "--output={tmp}/full"], "--output={tmp}/full exists and is not empty"),
    (["--workdir={wd}", "--output={tmp}/file"], "--output={tmp}/file exists and is not a folder"),
    (["--workdir={wd}", "--output={wd}/checkpoints/x"], "inside the workdir"),
    (["--workdir={wd}", "--output={tmp}/o", "--step=3"], "no checkpoint of step 3"),
    (["--workdir={wd}", "--output={tmp}/o", "--step=-1"], "--step=-1 must be >= 0"),
    (["--workdir={export}", "--output={tmp}/o"], "is an export already"),
    (["--workdir={wd}", "--output={tmp}/o", "extra"], "unexpected arguments: extra"),
  ],
  ids=[
    "no workdir",
    "no output",
    "missing workdir",
    "output not empty",
    "output a file",
    "output in checkpoints",
    "step not saved",
    "negative step",
    "export of an export",
    "positional argument",
  ],
)
def test_mistakes_are_one_line_and_exit_2(workdir, exported, tmp_path, args, message):
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("")
  (tmp_path / "file").write_text("")
  values = dict(tmp=tmp_path, wd=workdir, export=exported)
  r = run_export(*[a.format(**values) for a in args], cwd=tmp_path)
  assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
  assert message.format(**values) in lines[0]
  assert not os.path.exists(tmp_path / "o")


def test_an_export_opens_through_a_relative_path(workdir, exported, monkeypatch):
  # export.py --output=exports/NAME, then every reader given exports/NAME:
  # Orbax read a relative params/ folder's metadata as missing, and the
  # export was called damaged.
  monkeypatch.chdir(os.path.dirname(exported))
  name = os.path.basename(exported)
  _, model, step = compressive.load_with_step(name)
  config, want = compressive.load(workdir)
  assert step == 4
  np.testing.assert_array_equal(logits(model, config), logits(want, config))


@pytest.mark.slow
def test_the_round_trip_runs_from_another_folder_with_relative_paths(workdir, tmp_path):
  # As a newcomer types it, in a project folder: every tool as a module, every
  # path relative (runs/tiny, exports/tiny, cfg.py).
  shutil.copytree(workdir, tmp_path / "runs" / "tiny")
  write_config_file(
    tmp_path / "cfg.py",
    dict(num_train_steps=6, checkpoint_every_steps=2, eval_every_steps=0, log_every_steps=1),
  )

  def tool(name, *args):
    r = processes.run(
      [sys.executable, "-m", f"compressive.{name}", *args],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert r.returncode == 0, (name, r.stderr[-3000:])
    return r

  tool("train", "--config=cfg.py", "--workdir=runs/tiny")  # resumes 4 -> 6
  tool("export", "--workdir=runs/tiny", "--output=exports/tiny")
  assert (
    json.loads(
      tool("eval", "--workdir=exports/tiny", "--split=validation", "--max_segments=2")
      .stdout.strip()
      .splitlines()[-1]
    )["step"]
    == 6
  )
  assert tool("sample", "--workdir=exports/tiny", "--prompt=ab", "--num_tokens=4").stdout
  tool("analyze", "--workdir=exports/tiny", "--max_segments=8", "--buckets=2")
  _, model, step = compressive.load_with_step(str(tmp_path / "exports" / "tiny"))
  assert step == 6
