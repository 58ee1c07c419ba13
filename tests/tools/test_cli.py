"""The entry points as a user runs them: train.py with overrides, resume,
eval.py's JSON line, and clear errors with exit code 2. Each runs as
`python SCRIPT` would, in this process (tests/inprocess.py); the real
processes are tests/tools/test_entry_points.py's."""

import json
import os
import re
import sys
import textwrap

import pytest

from compressive import config as config_lib
from compressive import data as data_lib
from compressive.configs import default
from helpers import ROOT, TESTS
import inprocess
import processes

# Slow (tests train end to end): `make test-fast` (pytest -m 'not slow')
# leaves this file out.
pytestmark = pytest.mark.slow


def run(script, *args, cwd=ROOT):
  return inprocess.run(script, list(args), cwd=cwd)


@pytest.fixture
def tiny_config_file(tmp_path):
  path = tmp_path / "tiny.py"
  path.write_text(
    textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {TESTS!r})
      from helpers import tiny_experiment

      def get_config():
        return tiny_experiment()
      """)
  )
  return str(path)


def test_train_then_eval_then_resume(tmp_path, tiny_config_file):
  workdir = str(tmp_path / "wd")
  r = run(
    "train.py",
    f"--config={tiny_config_file}",
    f"--workdir={workdir}",
    "--config.num_train_steps=4",
    "--config.checkpoint_every_steps=2",
    "--config.model.compression=mean_pool",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "final evaluation" in r.stdout
  # The console: the time, then the line (absl's prefix only at -v 1); counts as integers.
  assert re.search(
    rf"^\d\d:\d\d:\d\d config {re.escape(tiny_config_file)}: [\d,]+ parameters", r.stderr, re.M
  ), r.stderr[-3000:]
  assert re.search(r"^\d\d:\d\d:\d\d step 4/4  loss ", r.stderr, re.M), r.stderr[-3000:]
  assert re.search(
    r"^\d\d:\d\d:\d\d eval at step 4 on validation: .*  tokens \d+  ", r.stderr, re.M
  ), r.stderr[-3000:]
  assert re.search(r"^final evaluation: .*tokens=\d+  ", r.stdout, re.M), r.stdout
  saved = json.load(open(os.path.join(workdir, "config.json")))
  assert saved["model"]["compression"] == "mean_pool"

  # The same command again: the run is finished, says so, trains nothing and
  # exits 0 (a retry loop stops; a stopped run exits 128 + its signal). At
  # absl's debug verbosity (-v 1) its own prefix comes back: level, date,
  # thread, file and line.
  r = run(
    "train.py",
    f"--config={tiny_config_file}",
    f"--workdir={workdir}",
    "--config.num_train_steps=4",
    "--config.checkpoint_every_steps=2",
    "--config.model.compression=mean_pool",
    "-v=1",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert re.search(
    r"^I\d{4} [\d:.]+ +\d+ runlog\.py:\d+\] the run is finished: step 4 of 4 "
    "is checkpointed",
    r.stderr,
    re.M,
  ), r.stderr[-3000:]
  assert "final evaluation" not in r.stdout and "resumed from" not in r.stderr

  r = run("eval.py", f"--workdir={workdir}", "--split=validation", "--compressed_memory_length=16")
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["compressed_memory_length"] == 16 and result["step"] == 4
  assert result["bits_per_byte"] > 0
  assert os.path.exists(os.path.join(workdir, "eval_validation_step4.json"))

  # analyze.py takes evaluation memory sizes too, and names its output by them.
  r = run(
    "analyze.py",
    f"--workdir={workdir}",
    "--analysis=loss_by_position",
    "--split=validation",
    "--compressed_memory_length=0",
    "--max_segments=3",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert os.path.exists(
    os.path.join(workdir, "analysis_loss_by_position_validation_compressed_memory_length0.json")
  )
  assert json.loads(r.stdout.strip().splitlines()[-1])["bits"]

  # The training curve, drawn again from the metrics alone (no model loaded).
  os.remove(os.path.join(workdir, "curves.png"))
  r = run("analyze.py", f"--workdir={workdir}", "--analysis=curves")
  assert r.returncode == 0, r.stderr[-3000:]
  drawn = json.loads(r.stdout.strip().splitlines()[-1])
  steps = [r["step"] for r in map(json.loads, open(os.path.join(workdir, "metrics_train.jsonl")))]
  assert (
    drawn
    == {
      "figure": os.path.join(workdir, "curves.png"),
      "title": f"training curve of {workdir}",
      "train_points": len(steps),
      "eval_points": 1,
    }
    and steps[-1] == 4
  )
  assert open(drawn["figure"], "rb").read(4) == b"\x89PNG"

  # A finished run resumed with a longer schedule goes on from its last
  # checkpoint and keeps the checkpoints it had (3 are kept: 2, 4 and 6).
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  assert before == ["2", "4", "workdir.json"]  # and the record of the workdir whose run they are
  r = run(
    "train.py",
    f"--config={tiny_config_file}",
    f"--workdir={workdir}",
    "--config.num_train_steps=6",
    "--config.checkpoint_every_steps=2",
    "--config.model.compression=mean_pool",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resumed from step 4" in r.stderr
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == sorted(before + ["6"])


def test_inconsistent_override_is_one_line_and_exit_2(tmp_path, tiny_config_file):
  r = run(
    "train.py",
    f"--config={tiny_config_file}",
    f"--workdir={tmp_path / 'wd'}",
    "--config.model.compression_rate=3",
  )
  assert r.returncode == 2
  assert r.stderr.strip().splitlines()[-1].startswith("error: model.segment_length=8")
  assert "Traceback" not in r.stderr
  assert not os.path.exists(tmp_path / "wd" / "checkpoints")


def test_a_repeated_override_trains_on_its_last_value(tmp_path, tiny_config_file):
  # One rule for every type: a tuple given twice once trained on both
  # (its elements joined), while a scalar's last value won.
  workdir = tmp_path / "wd"
  r = run(
    "train.py",
    f"--config={tiny_config_file}",
    f"--workdir={workdir}",
    "--config.data.synthetic.num_docs=(99,9,9)",
    "--config.data.synthetic.num_docs=(16,4,4)",
    "--config.model.compression=conv",
    "--config.model.compression=mean_pool",
    "--config.num_train_steps=50",
    "--config.num_train_steps=2",
    "--config.optimizer.learning_rate=0.5",
    "--config.optimizer.learning_rate=0.001",
    "--config.model.scan_layers=true",
    "--noconfig.model.scan_layers",
    "--config.checkpoint_every_steps=2",
    "--config.eval.max_segments=1",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  saved = json.load(open(workdir / "config.json"))
  assert saved["data"]["synthetic"]["num_docs"] == [16, 4, 4]
  assert saved["model"]["compression"] == "mean_pool" and saved["model"]["scan_layers"] is False
  assert saved["num_train_steps"] == 2 and saved["optimizer"]["learning_rate"] == 0.001
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "workdir.json"]


def test_eval_of_a_missing_workdir(tmp_path):
  r = run("eval.py", f"--workdir={tmp_path / 'nothing'}")
  assert r.returncode == 2 and "not a training workdir" in r.stderr
  assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "Traceback" not in r.stderr


@pytest.mark.parametrize(
  "script,extra", [("eval.py", []), ("sample.py", ["--prompt=x"]), ("analyze.py", [])]
)
def test_entry_points_run_from_another_directory(tmp_path, script, extra):
  r = run(
    os.path.join(ROOT, script), f"--workdir={tmp_path / 'nothing'}", *extra, cwd=str(tmp_path)
  )
  assert r.returncode == 2, r.stderr[-3000:]
  assert r.stderr.strip().startswith("error: ") and "not a training workdir" in r.stderr


# The flags cli_flags.define_*_flags define for a tool are the tool's own: its
# --help lists them with their help (train.py's multi-host help in full, the
# others' referring to it).
SHARED_FLAGS = {
  "train.py": ["workdir", "multihost", "coordinator_address", "num_processes", "process_id"],
  "eval.py": [
    "workdir",
    "step",
    "split",
    "max_segments",
    "progress_seconds",
    "memory_length",
    "compressed_memory_length",
    "mesh_shape",
    "multihost",
    "process_id",
  ],
  "analyze.py": [
    "workdir",
    "step",
    "split",
    "max_segments",
    "progress_seconds",
    "memory_length",
    "compressed_memory_length",
    "mesh_shape",
  ],
  "sample.py": ["workdir", "step", "memory_length", "compressed_memory_length", "mesh_shape"],
  "export.py": ["workdir", "step", "output"],
}


@pytest.mark.parametrize("script", sorted(SHARED_FLAGS))
def test_shared_flags_are_listed_by_each_tools_help(script):
  r = run(script, "--help")  # on stdout, exit 0 (absl's own exits with 1)
  assert r.returncode == 0 and f"\n{script}:" in r.stdout, r.stderr[-3000:]
  own = " ".join(r.stdout.split(f"\n{script}:", 1)[1].split())  # the tool's own flags
  for name in SHARED_FLAGS[script]:
    assert f" --{name}:" in own or f" --[no]{name}:" in own, name
  assert ("run the same command on every host" in own) == (script == "train.py")
  assert ("(as train.py)" in own) == (script == "eval.py")
  assert ("0 removes the compressed memory" in own) == (script == "analyze.py")
  if script == "train.py":  # the config flag, and the names it takes
    assert " --config: " in own and "Shipped configs (--config=NAME" in r.stdout
    assert "default, default_rope, default_txl, enwik8" in " ".join(r.stdout.split())


def test_print_config_and_dry_run_check_and_write_nothing(tmp_path):
  r = run("train.py", f"--workdir={tmp_path}/wd", "--print_config", "--config.batch_size=8")
  assert r.returncode == 0, r.stderr[-3000:]
  # What config.json records: JSON, every field, evaluation's sizes resolved.
  printed = json.loads(r.stdout)
  want = config_lib.check(default.get_config(), training=False, here=False, num_devices=1)
  assert printed == json.loads(
    json.dumps(dict(want.to_dict(), batch_size=8, eval=dict(want.to_dict()["eval"], batch_size=8)))
  )
  assert printed["model"]["compression_rate"] == 2 and printed["eval"]["memory_length"] == 128
  r = run("train.py", f"--workdir={tmp_path}/wd", "--print_config", "--config.batch_size=0")
  assert r.returncode == 2 and "batch_size" in r.stderr.strip().splitlines()[-1]
  # The index's advice (python -m compressive) needs no workdir; training does.
  r = run("train.py", "--config=default", "--print_config")
  assert r.returncode == 0 and json.loads(r.stdout)["batch_size"] == 16, r.stderr[-3000:]
  r = run("train.py", "--config=default")
  assert r.returncode == 2 and r.stderr.strip() == (
    "error: --workdir is required (only --print_config runs without one)"
  ), r.stderr
  # One input.txt too short for a batch of 64 rows, then long enough.
  own = (
    "--dry_run",
    "--config.data.source=text_files",
    f"--config.data.text_files.path={tmp_path}/input.txt",
  )
  (tmp_path / "input.txt").write_text("".join(f"line {i} of my own text\n" for i in range(4000)))
  r = run("train.py", f"--workdir={tmp_path}/wd", *own, "--config.batch_size=64")
  assert r.returncode == 2 and "documents but the batch has 64 rows" in r.stderr
  assert not os.path.lexists(tmp_path / "wd")
  (tmp_path / "input.txt").write_text("".join(f"line {i} of my own text\n" for i in range(20000)))
  r = run("train.py", f"--workdir={tmp_path}/wd", *own)
  assert r.returncode == 0, r.stderr[-3000:]
  line = r.stdout.strip().splitlines()[-1]
  assert line.startswith(f"dry run: would start {tmp_path}/wd afresh: ") and " cpu devices" in line
  # The corpus: its source, where it is, and its documents per split.
  docs = {
    s: len(
      data_lib.get_documents(
        data_lib.DataConfig.from_dict(
          dict(
            default.get_config().data.to_dict(),
            source="text_files",
            text_files=dict(path=f"{tmp_path}/input.txt"),
          )
        ),
        s,
        data_lib.ByteTokenizer(),
      )
    )
    for s in data_lib.SPLITS
  }
  assert (
    f"; data.source=text_files ({tmp_path}/input.txt): train {docs['train']}, validation "
    f"{docs['validation']}, test {docs['test']} documents; nothing trained or written" in line
  )
  assert not os.path.lexists(tmp_path / "wd")


def test_a_tool_whose_reader_has_gone_ends_quietly(tmp_path):
  # A runner killed while its child trains: the child saves and stops, and
  # its last lines have nowhere to go (stdout and stderr both closed pipes).
  code = textwrap.dedent("""
      import sys
      from compressive import cli

      def main(argv):
        print("final evaluation: ...", flush=True)
        print("done", file=sys.stderr, flush=True)

      cli.run(main, "a tool")
      """)
  r_out, w_out = os.pipe()
  os.close(r_out)  # the reader is gone before the tool writes
  proc = processes.run([sys.executable, "-c", code], stdout=w_out, stderr=w_out, timeout=120)
  os.close(w_out)
  assert proc.returncode == 0
