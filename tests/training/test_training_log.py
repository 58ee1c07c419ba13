"""What a run tells its user: the log file, MFU where the peak is known, time
spent evaluating and checkpointing, the warmup warning, hyperparameters,
--profile_steps; and the tools' progress lines on stderr with the result alone
on stdout."""

import json
import logging
import os
import re

import pytest

from compressive.model.config import ModelConfig
from compressive.scale import flops
from compressive.training import loop as train_lib
from compressive.training.metrics import MetricWriter, read_jsonl
from compressive.training.writers import hparams
from helpers import tiny_experiment, to_train, write_config_file
import inprocess


def run(script, *args):
  """The tool in this process, as `python SCRIPT` runs it (tests/inprocess.py)."""
  return inprocess.run(script, list(args))


def messages(caplog):
  return [r.getMessage() for r in caplog.records if r.name == "compressive"]


class RecordingWriter(MetricWriter):
  hparams: list = []

  def write_hparams(self, config):  # what MetricWriter logs, recorded
    RecordingWriter.hparams.append(hparams(config))


@pytest.mark.slow
def test_the_log_file_holds_the_console_lines_once_across_a_resume(tmp_path, caplog, monkeypatch):
  monkeypatch.setattr(train_lib, "MetricWriter", RecordingWriter)
  RecordingWriter.hparams = []
  config = tiny_experiment(
    **{
      "num_train_steps": 4,
      "log_every_steps": 1,
      "eval_every_steps": 0,
      "checkpoint_every_steps": 2,
    }
  )
  workdir = tmp_path / "wd"
  with caplog.at_level(logging.INFO, logger="compressive"):
    train_lib.train_and_evaluate(to_train(config), str(workdir), stop_at_step=2)
    train_lib.train_and_evaluate(to_train(config), str(workdir))  # resumed in the same process
  assert not [
    h for h in logging.getLogger("compressive").handlers if isinstance(h, logging.FileHandler)
  ]  # removed on return
  lines = (workdir / "train.log").read_text().splitlines()
  logged = messages(caplog)
  for message in logged:  # every console line, in the file as often (once per run)
    assert sum(line.endswith(message) for line in lines) == logged.count(message), message
  steps = [line for line in lines if " step " in line and "/4  loss" in line]
  assert [line.split(" step ")[1].split("/")[0] for line in steps] == ["1", "2", "3", "4"]
  assert sum("resumed from step 2" in line for line in lines) == 1
  # Each run's start says its size and where its files are, and its end
  # draws the training curve from the metrics (steps 1-4, both runs').
  sizes = [line for line in lines if "tokens per step" in line]
  assert len(sizes) == 2 and "39,552 parameters in float32" in sizes[0], sizes
  assert sizes[0].endswith("steps 1-2 of 4") and sizes[1].endswith("steps 3-4 of 4"), sizes
  assert sum("the run's files:" in line and "tensorboard --logdir" in line for line in lines) == 2
  assert (workdir / "curves.png").read_bytes().startswith(b"\x89PNG")
  assert sum(line.endswith(f"training curve: {workdir}/curves.png") for line in lines) == 2
  # On CPU no peak is known: no MFU, in the line or the metrics.
  assert not any("MFU" in line for line in steps)
  assert not any("mfu" in r for r in read_jsonl(str(workdir / "metrics_train.jsonl")))
  # Time spent checkpointing, each save and in total; no warmup warning (2 < 4).
  assert sum("checkpoint of step" in line and "training waited" in line for line in lines) == 2
  assert any("steps 3-4 took" in line and "waiting for checkpoints" in line for line in lines)
  assert not any("warmup" in line for line in lines)
  # The hyperparameters, once per run, flat.
  assert len(RecordingWriter.hparams) == 2
  flat = RecordingWriter.hparams[0]
  assert flat["model.d_model"] == 32 and flat["grad_accum_steps"] == 1
  assert flat["optimizer.learning_rate"] == config.optimizer.learning_rate
  assert isinstance(flat["mesh.shape"], str)  # a tuple
  assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())


def test_the_eta_counts_the_evaluations_and_checkpoints_left():
  from compressive.training import runlog

  train = to_train(
    tiny_experiment(
      **{"num_train_steps": 260, "eval_every_steps": 100, "checkpoint_every_steps": 50}
    )
  ).train
  clock = runlog.Clock()
  assert runlog.remaining_pauses(train, 25, 260, clock) == 0  # none measured yet
  clock.spent, clock.times = {"eval": 8.0, "save": 3.0}, {"eval": 2, "save": 3}
  # After step 25: evaluations at 100, 200 and the last step (3 x 4 s) and
  # saves at 50, 100, ..., 250 and the last step (6 x 1 s).
  assert runlog.remaining_pauses(train, 25, 260, clock) == 3 * 4.0 + 6 * 1.0
  assert runlog.remaining_pauses(train, 250, 260, clock) == 4.0 + 1.0
  assert runlog.remaining_pauses(train, 260, 260, clock) == 0
  # A run stopping early (stop_at_step=120) saves at its end, and the last
  # step's evaluation is not in it.
  assert runlog.remaining_pauses(train, 25, 120, clock) == 4.0 + 3 * 1.0


@pytest.mark.slow
def test_evaluation_time_is_logged(tmp_path, caplog):
  config = tiny_experiment(
    **{
      "num_train_steps": 2,
      "eval_every_steps": 1,
      "checkpoint_every_steps": 0,
      "eval.max_segments": 2,
    }
  )
  with caplog.at_level(logging.INFO, logger="compressive"):
    train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"))
  evals = [m for m in messages(caplog) if m.startswith("eval at step")]
  assert len(evals) == 2 and all(m.endswith(" s)") for m in evals)
  total = [m for m in messages(caplog) if m.startswith("steps 1-2 took")]
  assert len(total) == 1 and "evaluation" in total[0] and "(2)" in total[0]


@pytest.mark.parametrize("dtype,warned", [("float32", False), ("bfloat16", True)])
def test_the_run_names_its_platform_and_an_accelerator_config_on_cpu_warns(
  tmp_path, caplog, dtype, warned
):
  config = tiny_experiment(**{"num_train_steps": 4, "model.dtype": dtype})
  with caplog.at_level(logging.INFO, logger="compressive"):
    train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"), stop_at_step=0)  # no step
  assert any(
    re.match(r"mesh \{.*\} over \d+ cpu devices \(cpu\) in 1 processes", m)
    for m in messages(caplog)
  ), messages(caplog)
  # And what it trains on: the source, where it is, the documents it reads.
  assert (
    "data.source=synthetic (generated): train 16, validation (evaluated) 4 documents"
    in messages(caplog)
  )
  found = [
    r for r in caplog.records if "on CPU devices: a config meant for a GPU or TPU" in r.getMessage()
  ]
  assert len(found) == warned and all(r.levelno == logging.WARNING for r in found)


@pytest.mark.slow
@pytest.mark.parametrize("warmup,warned", [(4, True), (9, True), (3, False)])
def test_warmup_longer_than_the_run_is_a_warning(tmp_path, caplog, warmup, warned):
  # The run as long as its warmup trains to its end: the rate the warning
  # names is the one the metrics log at the last step (the rate of that
  # step's update), below the peak.
  whole = warmup == 4
  config = tiny_experiment(
    **{
      "num_train_steps": 4,
      "optimizer.warmup_steps": warmup,
      "log_every_steps": 1,
      "eval_every_steps": 0,
      "checkpoint_every_steps": 0,
    }
  )
  with caplog.at_level(logging.INFO, logger="compressive"):
    train_lib.train_and_evaluate(
      to_train(config), str(tmp_path / "wd"), stop_at_step=None if whole else 0
    )
  found = [r for r in caplog.records if "warmup_steps" in r.getMessage()]
  assert len(found) == (1 if warned else 0)
  if warned:
    assert found[0].levelno == logging.WARNING
    assert "warmup_steps" in (tmp_path / "wd" / "train.log").read_text()
  if whole:
    last = read_jsonl(str(tmp_path / "wd" / "metrics_train.jsonl"))[-1]
    peak, updates = config.optimizer.learning_rate, 4 * config.segments_per_step
    assert last["step"] == 4  # one update per segment: the last one's rate is below the peak
    assert last["learning_rate"] == pytest.approx(peak * (updates - 1) / updates)
    assert (
      f"its last update's is {last['learning_rate']:.4g}, below "
      f"optimizer.learning_rate={peak:g}" in found[0].getMessage()
    )


@pytest.mark.slow
def test_mfu_is_logged_where_the_peak_is_known(tmp_path, caplog, monkeypatch):
  # CPU has no peak: pretend it is a 1 GFLOP/s chip.
  monkeypatch.setattr(flops, "PEAK_TFLOPS", (("cpu", (1e-3, 1e-3)),) + flops.PEAK_TFLOPS)
  config = tiny_experiment(
    **{
      "num_train_steps": 3,
      "log_every_steps": 1,
      "eval_every_steps": 0,
      "checkpoint_every_steps": 0,
    }
  )
  with caplog.at_level(logging.INFO, logger="compressive"):
    train_lib.train_and_evaluate(to_train(config), str(tmp_path / "wd"))
  steps = [m for m in messages(caplog) if m.startswith("step ")]
  # Step 1's compilation is left out of its time (jit compiles before it
  # dispatches, and the clock starts when dispatch returns), so every step
  # is timed, the first included.
  assert len(steps) == 3 and all("% " in m.split("MFU ")[1] for m in steps)
  assert any("first step compiled and dispatched in" in m for m in messages(caplog))
  rows = read_jsonl(str(tmp_path / "wd" / "metrics_train.jsonl"))
  per_token = flops.flops_per_token(ModelConfig.from_config(config.model), config.batch_size).train
  assert len(rows) == 3
  for row in rows:
    assert row["mfu"] == pytest.approx(row["tokens_per_second"] * per_token / 1e9)


def test_peak_lookup_by_device_kind():
  assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
  assert flops.peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
  assert flops.peak_flops("NVIDIA H200", "float32") == 494.5e12
  assert flops.peak_flops("NVIDIA A100-SXM4-40GB", "float32") == 156e12
  assert flops.peak_flops("TPU v5 lite", "bfloat16") == 197e12
  assert flops.peak_flops("TPU v5p", "bfloat16") == 459e12
  assert flops.peak_flops("TPU v4", "float32") == 275e12
  assert flops.peak_flops("TPU v4 lite", "bfloat16") is None
  assert flops.peak_flops("cpu", "float32") is None
  assert flops.peak_flops("NVIDIA GeForce GTX 1080", "float32") is None


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  return write_config_file(
    tmp_path_factory.mktemp("cfg") / "tiny.py",
    {
      "num_train_steps": 3,
      "eval_every_steps": 0,
      "checkpoint_every_steps": 0,
      "log_every_steps": 1,
    },
  )


@pytest.fixture(scope="module")
def trained(config_file, tmp_path_factory):
  """A train.py run that profiles step 2."""
  workdir = tmp_path_factory.mktemp("trained") / "wd"
  r = run("train.py", f"--config={config_file}", f"--workdir={workdir}", "--profile_steps=2,2")
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir, r


@pytest.mark.slow
def test_profile_steps_writes_a_trace(trained):
  workdir, r = trained
  traces = [
    os.path.join(root, name)
    for root, _, names in os.walk(workdir / "profile")
    for name in names
    if name.endswith(".xplane.pb")
  ]
  assert traces, list(os.walk(workdir / "profile"))
  assert "profiling steps 2-2" in r.stderr
  assert "profiling steps 2-2" in (workdir / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("value", ["3,1", "0,2", "2", "a,b", "1,2,3"])
def test_a_bad_profile_steps_is_one_line_and_exit_2(config_file, tmp_path, value):
  r = run(
    "train.py",
    f"--config={config_file}",
    f"--workdir={tmp_path / 'wd'}",
    f"--profile_steps={value}",
  )
  assert r.returncode == 2, r.stderr[-3000:]
  assert r.stderr.strip().splitlines() == [
    f"error: --profile_steps={value} must be START,END: two step numbers with 1 <= START <= END"
  ]
  assert not os.path.exists(tmp_path / "wd")


@pytest.mark.slow
def test_eval_progress_goes_to_stderr_and_the_result_alone_to_stdout(trained):
  workdir, _ = trained
  r = run("eval.py", f"--workdir={workdir}", "--progress_seconds=0", "--max_segments=3")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "eval: segment 2/3," in r.stderr and "eval: segment 3/3," in r.stderr
  assert "tok/s, ETA 0:00:00" in r.stderr
  out = r.stdout.strip().splitlines()
  assert len(out) == 1
  result = json.loads(out[-1])
  assert result["split"] == "validation"  # the default, as analyze.py's
  # Its last line on stderr names the file the result was saved in.
  saved = f"{workdir}/eval_validation_step{result['step']}.json"
  assert r.stderr.strip().splitlines()[-1] == f"result: {saved}"
  assert json.loads(open(saved).read()) == result


@pytest.mark.slow
def test_analyze_and_sample_take_the_mesh_and_memory_flags(trained):
  workdir, _ = trained
  r = run(
    "analyze.py",
    f"--workdir={workdir}",
    "--analysis=loss_by_position",
    "--progress_seconds=0",
    "--max_segments=3",
    "--mesh_shape=-1,1,1",
    "--memory_length=4",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "loss_by_position: segment 2/3," in r.stderr
  assert json.loads(r.stdout.strip().splitlines()[-1])["bits"]
  assert os.path.exists(workdir / "analysis_loss_by_position_validation_memory_length4.json")

  r = run(
    "sample.py",
    f"--workdir={workdir}",
    "--prompt=abc",
    "--num_tokens=3",
    "--memory_length=4",
    "--compressed_memory_length=0",
    "--mesh_shape=1,1,1",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.startswith("abc")

  for script, extra in (("sample.py", ["--prompt=abc"]), ("analyze.py", []), ("eval.py", [])):
    r = run(script, f"--workdir={workdir}", "--mesh_shape=a,1,1", *extra)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
      "error: --mesh_shape=a,1,1 must be integers"
    ], (script, r.stderr[-3000:])
  r = run("sample.py", f"--workdir={workdir}", "--prompt=abc", "--compressed_memory_length=-3")
  assert r.returncode == 2 and r.stderr.strip().startswith("error: --compressed_memory_length=-3")
