"""Workdirs and exports on Cloud Storage (compressive/remote.py), against a
Cloud Storage server the tests start (fake-gcs-server, tests/gcs_server.py):
gcsfs and TensorStore talk to it as they would to Google's."""

import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
import pytest

import compressive
from compressive import remote
from compressive.errors import ConfigError, DataError
from compressive.training import layout, sidefiles
from compressive.training import loop as train_lib
from compressive.training import setup as setup_lib
import gcs_server
from helpers import (
  ROOT,
  assert_same_params,
  params_of,
  process_env,
  tiny_experiment,
  to_train,
  write_config_file,
)
import inprocess
import processes

STEPS = 12
# Every test here talks to the server, a process of its own: none is in
# `make test-fast`, which starts no process.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gcs():
  """The server, its bucket `runs`, and this process's clients pointed at it."""
  with gcs_server.serve() as server:
    saved = {name: os.environ.get(name) for name in server.env()}
    os.environ.update(server.env())
    try:
      server.create_bucket("runs")
      yield server
    finally:
      for name, value in saved.items():
        if value is None:
          os.environ.pop(name, None)
        else:
          os.environ[name] = value


@pytest.fixture
def local_tmp(tmp_path, monkeypatch):
  """A temporary directory of the test's own, where its mirrors are made."""
  folder = tmp_path / "tmp"
  folder.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(folder))
  return folder


def mirrors_left(folder) -> list[str]:
  """The mirrors' and uploads' folders still in the temporary directory `folder`."""
  return [
    n for n in os.listdir(folder) if n.startswith(("compressive-mirror-", "compressive-upload-"))
  ]


def new_url() -> str:
  return f"gs://runs/{uuid.uuid4().hex[:8]}"


def under(server, url: str) -> list[str]:
  """The objects under `url` (gs://runs/PREFIX), relative to it."""
  prefix = url.removeprefix("gs://runs/") + "/"
  return [n[len(prefix) :] for n in server.objects("runs") if n.startswith(prefix)]


def steps_logged(lines: str) -> list[int]:
  return [json.loads(line)["step"] for line in lines.splitlines() if line.strip()]


# -- In process. -------------------------------------------------------------------


def test_a_run_on_cloud_storage_writes_its_checkpoints_and_files_there(
  gcs, tmp_path, local_tmp, caplog
):
  caplog.set_level(logging.INFO, logger="compressive")  # train.log's lines, as train.py logs
  url = new_url()
  train_lib.train_and_evaluate(
    to_train(tiny_experiment(num_train_steps=4, checkpoint_every_steps=2)), url
  )
  objects = under(gcs, url)
  for name in ("config.json", "train.log", "metrics_train.jsonl", "curves.png"):
    assert name in objects, objects
  assert {"2", "4"} <= {n.split("/")[1] for n in objects if n.startswith("checkpoints/")}
  assert any(n.startswith("tensorboard/train/events") for n in objects), objects
  assert not mirrors_left(local_tmp)  # the mirror closed, its folder gone
  # The side files there are the run's whole: the log names the URL, never
  # the local mirror, and the metrics reach the last step.
  log = remote.read_bytes(f"{url}/train.log").decode()
  assert f"the run's files: {url}/config.json" in log and "compressive-mirror-" not in log
  assert steps_logged(remote.read_bytes(f"{url}/metrics_train.jsonl").decode())[-1] == 4
  # The library reads it from the bucket as it reads a workdir on disk.
  experiment, model = compressive.load(url)
  assert experiment.train.num_train_steps == 4 and model is not None
  train_lib.train_and_evaluate(to_train(tiny_experiment(num_train_steps=4)), tmp_path / "local")
  assert_same_params(url, tmp_path / "local")


def test_a_start_that_fails_before_its_run_begins_leaves_nothing_in_the_bucket(
  gcs, local_tmp, monkeypatch
):
  url = new_url()

  def no_data(*args, **kwargs):
    raise DataError("no documents")

  monkeypatch.setattr(setup_lib, "train_data", no_data)
  with pytest.raises(DataError):
    train_lib.train_and_evaluate(to_train(tiny_experiment(num_train_steps=2)), url)
  assert under(gcs, url) == []
  assert not mirrors_left(local_tmp)


def test_a_mirror_copies_back_only_what_changed_and_never_the_checkpoints(gcs):
  url = new_url()
  remote._epath(f"{url}/config.json").write_text("{}")
  remote._epath(f"{url}/metrics_train.jsonl").write_text('{"step": 1}\n')
  remote._epath(f"{url}/checkpoints/1/x").write_text("a checkpoint's file")
  with layout.opened(url) as run:
    local = run.root
    assert sorted(os.listdir(local)) == ["config.json", "metrics_train.jsonl"]
    assert run.url == url and run.checkpoints == f"{url}/checkpoints"
    assert run.config == os.path.join(local, "config.json")
    assert run.public(f"cannot read {local}/x") == f"cannot read {url}/x"
    # The value carries the URL; the folder alone is a folder on this machine.
    assert layout.Workdir(local).checkpoints == os.path.join(local, "checkpoints")
    # Another writer replaces the metrics in the bucket meanwhile: this
    # mirror did not change them, so it never copies its old ones back.
    remote._epath(f"{url}/metrics_train.jsonl").write_text('{"step": 2}\n')
    with open(os.path.join(local, "eval_test_step1.json"), "w") as f:
      f.write("{}")
  assert not os.path.exists(local)
  assert remote.read_bytes(f"{url}/metrics_train.jsonl") == b'{"step": 2}\n'
  assert remote.read_bytes(f"{url}/eval_test_step1.json") == b"{}"


def test_a_mirror_is_a_value_two_mirrors_and_a_local_run_live_side_by_side(gcs, tmp_path):
  # Nothing is held by the process: each place answers for itself, whatever
  # else is open, and no log line is rewritten behind the sites' backs.
  first, second = new_url(), new_url()
  local = layout.Workdir(str(tmp_path / "local"))
  with layout.opened(first) as a, layout.opened(second) as b:
    assert (a.checkpoints, b.checkpoints) == (f"{first}/checkpoints", f"{second}/checkpoints")
    assert a.root != b.root and (a.url, b.url) == (first, second)
    assert local.checkpoints == str(tmp_path / "local" / "checkpoints") and local.url is None
    assert layout.Workdir(a.root).url is None  # the folder alone names no URL
    assert a.public(f"{b.root}/x") == f"{b.root}/x"  # each names its own folder only
    assert logging.getLogger("compressive").filters == []
    assert layout.export(b).params == f"{second}/params"  # an export there, by the same value


def test_an_error_that_ends_the_work_in_a_mirror_names_the_url(gcs):
  url = new_url()
  with pytest.raises(DataError) as raised:
    with layout.opened(url) as run:
      raise DataError(f"{run.root}/config.json cannot be read")
  assert str(raised.value) == f"{url}/config.json cannot be read"
  with pytest.raises(FileNotFoundError) as missing:
    with layout.opened(url) as run:
      open(os.path.join(run.root, "eval_test_step1.json"))
  assert missing.value.filename == f"{url}/eval_test_step1.json"
  with pytest.raises(ConfigError, match=re.escape(f"{url}/x holds")):
    with remote.Upload(url, "--output") as upload:
      raise ConfigError(f"{upload.local}/x holds nothing")


def test_what_a_trainer_sets_aside_in_a_mirror_is_named_by_the_url(gcs, caplog):
  url = new_url()
  with layout.opened(url) as run:
    os.mkdir(run.log)  # a folder in train.log's place
    sidefiles.prepare(run)
  assert f"{url}/train.log is a folder, not a file; set aside as {url}/train.log.aside" in (
    caplog.text
  )


def test_a_damaged_checkpoint_on_cloud_storage_is_moved_aside_by_restore_intact(gcs, caplog):
  caplog.set_level(logging.INFO, logger="compressive")
  url = new_url()
  config = tiny_experiment(num_train_steps=4, checkpoint_every_steps=2)
  train_lib.train_and_evaluate(to_train(config), url)
  record = f"{url}/checkpoints/4/integrity/metadata"
  remote._epath(record).write_text("{ not json")
  config.num_train_steps = 6
  train_lib.train_and_evaluate(to_train(config), url, restore_intact=True)
  objects = under(gcs, url)
  assert "checkpoints/skipped/4/integrity/metadata" in objects, objects
  assert "resumed from step 2" in remote.read_bytes(f"{url}/train.log").decode()
  assert {"4", "6"} <= {n.split("/")[1] for n in objects if n.startswith("checkpoints/")}


def test_tools_name_the_url_in_their_one_line_errors(gcs):
  missing = new_url()
  r = inprocess.run("eval.py", [f"--workdir={missing}"])
  assert r.returncode == 2, r.stderr
  [line] = r.stderr.strip().splitlines()
  assert line.startswith("error: ") and missing in line and "compressive-mirror-" not in line
  for flag, what in (("workdir", "a workdir"), ("output", "an export")):
    args = (
      ["--workdir=s3://b/run"]
      if flag == "workdir"
      else [f"--workdir={missing}", "--output=s3://b/export"]
    )
    r = inprocess.run("export.py", args + (["--output=/tmp/x"] if flag == "workdir" else []))
    assert r.returncode == 2 and "gs://" in r.stderr and what in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_bucket_that_does_not_exist_is_one_line_before_any_work(gcs, tmp_path):
  r = inprocess.run(
    "train.py",
    [f"--config={write_config_file(tmp_path / 'c.py')}", "--workdir=gs://no-such-bucket/run"],
  )
  assert r.returncode == 2 and r.stderr.strip() == (
    "error: gs://no-such-bucket/run: the bucket no-such-bucket does not exist, or these "
    "credentials cannot see it; create it first (gcloud storage buckets create "
    "gs://no-such-bucket)"
  ), r.stderr
  assert gcs.buckets() == ["runs"]  # none was made


def test_an_export_to_a_place_on_cloud_storage_that_holds_something_is_refused(gcs):
  url = new_url()
  remote._epath(f"{url}/something").write_text("x")
  r = inprocess.run("export.py", [f"--workdir={new_url()}", f"--output={url}"])
  assert r.returncode == 2 and r.stderr.strip() == (
    f"error: --output={url} exists and is not empty: give a new or empty place"
  ), r.stderr
  assert under(gcs, url) == ["something"]


# STORAGE_EMULATOR_HOST alone: gcsfs reaches the server, TensorStore (the
# checkpoints') goes to Google's for credentials and never answers. The
# start says so in one line, within the bound (shortened here), with a line
# a second while it waits.
HALF_CONFIGURED = """
import runpy, sys
from compressive import remote
from compressive import storage
remote.PROBE_S, storage.PROGRESS_S = 6.0, 2.0
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_module("compressive.train", run_name="__main__")
"""


def test_tensorstore_that_cannot_reach_the_bucket_is_one_line_at_the_start(gcs, tmp_path):
  env = process_env()
  for name in gcs.env():
    env.pop(name, None)
  env.update(
    STORAGE_EMULATOR_HOST=gcs.url,
    EPATH_USE_TF="false",
    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
    no_proxy="127.0.0.1,localhost",
    NO_PROXY="127.0.0.1,localhost",
    GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "no"),
    HOME=str(tmp_path),
  )
  config = write_config_file(tmp_path / "c.py")
  url = new_url()
  start = time.monotonic()
  p = processes.run(
    [sys.executable, "-c", HALF_CONFIGURED, f"--config={config}", f"--workdir={url}"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  # The run hung 8 min 50 s after its last step; now: the probe's bound (6 s
  # here), and a loaded machine's start.
  assert time.monotonic() - start < 6 + 120
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2, p.stderr[-3000:]
  assert lines[-1].startswith(
    f"error: cannot read {url}: TensorStore, which writes the checkpoints: "
  ), lines[-1]
  assert lines[-1].endswith(
    "; with STORAGE_EMULATOR_HOST set, set TENSORSTORE_GCS_HTTP_URL "
    "to the same URL (and GOOGLE_AUTH_TOKEN_FOR_TESTING for an "
    "emulator)"
  ), lines[-1]
  waited = [line for line in lines if "still waiting for Cloud Storage" in line]
  assert waited and all(f"({url}): " in line for line in waited), lines
  assert not any(line.startswith(("I", "E")) and "] " in line for line in lines), lines
  assert under(gcs, url) == []  # nothing begun


# -- As a user runs the tools. -------------------------------------------------------


def tool(script, *args):
  """A reading tool as a user runs it, in this process (its subject is the
  bucket, not the process; train.py, stopped by a signal, runs in its own)."""
  p = inprocess.run(script, list(args))
  assert p.returncode == 0, p.stderr[-3000:]
  return p.stdout


def test_stopped_resumed_evaluated_and_exported_on_cloud_storage_like_a_local_run(gcs, tmp_path):
  """train.py on gs:// stopped by SIGTERM (143) and resumed, then eval.py
  and export.py on it: the same parameters, evaluation and metrics as a
  straight run in a local workdir; sample.py and analyze.py read there."""
  env = process_env(**gcs.env())
  config = write_config_file(
    tmp_path / "c.py", {"num_train_steps": STEPS, "checkpoint_every_steps": 2}
  )
  local = tmp_path / "local"
  straight = processes.start(  # beside the stopped one
    [sys.executable, "train.py", f"--config={config}", f"--workdir={local}"],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  url = new_url()
  p = processes.start(
    [sys.executable, "train.py", f"--config={config}", f"--workdir={url}"],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  for line in p.stderr:
    if "step 6/" in line:
      break
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=300)
  assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
  stopped = int(err.strip().splitlines()[-1].split("after step ")[1].split()[0])
  assert 6 <= stopped < STEPS and f"{url}" in err and "compressive-mirror-" not in err
  assert steps_logged(remote.read_bytes(f"{url}/metrics_train.jsonl").decode())[-1] >= 6
  resumed = processes.run(
    [sys.executable, "train.py", f"--config={config}", f"--workdir={url}"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert resumed.returncode == 0 and f"resumed from step {stopped}" in resumed.stderr
  # TensorStore's own log line (the credentials it uses) is not the console's.
  assert "google_auth_provider" not in resumed.stderr + err, resumed.stderr[-3000:]
  assert straight.wait(timeout=600) == 0, straight.stderr.read()[-3000:]
  # Every logged step once, in order, as in the local run.
  metrics = remote.read_bytes(f"{url}/metrics_train.jsonl").decode()
  assert steps_logged(metrics) == steps_logged((local / "metrics_train.jsonl").read_text())
  on_gcs = json.loads(tool("eval.py", f"--workdir={url}"))
  on_disk = json.loads(tool("eval.py", f"--workdir={local}"))
  assert on_gcs == on_disk
  assert json.loads(remote.read_bytes(f"{url}/eval_validation_step{STEPS}.json")) == on_gcs
  exported = json.loads(tool("export.py", f"--workdir={url}", f"--output={url}-export"))
  assert exported["workdir"] == url and exported["output"] == f"{url}-export"
  manifest = json.loads(remote.read_bytes(f"{url}-export/export.json"))
  assert manifest["source"] == url  # the workdir's URL, never its local copy
  assert_same_params(f"{url}-export", local)
  # The other tools on the bucket: a sample from the export, the curve
  # redrawn from the workdir's metrics there.
  assert tool("sample.py", f"--workdir={url}-export", "--prompt=ab", "--num_tokens=4").startswith(
    "ab"
  )
  curve = json.loads(tool("analyze.py", f"--workdir={url}", "--analysis=curves"))
  assert curve["figure"] == f"{url}/curves.png" and remote.size(curve["figure"]) > 0
  assert curve["title"] == f"training curve of {url}"  # the URL, not the mirror's folder
  for a, b in zip(params_of(url), params_of(local)):
    np.testing.assert_array_equal(a, b)


# -- The bucket is read like a disk. -------------------------------------------------


def test_a_mirror_copies_only_the_run_files_by_name_never_a_stray_object(gcs):
  # Every object beside config.json was read whole: a stray 600 MB one took
  # eval.py to 1.77 GB resident.
  url = new_url()
  remote._epath(f"{url}/config.json").write_text("{}")
  remote._epath(f"{url}/stray.bin").write_bytes(b"\0" * (8 << 20))
  remote._epath(f"{url}/notes.txt").write_text("not the run's")
  read = []
  original = remote._copy
  monkeypatch_copy = lambda r, w, limit=None: read.append(limit) or original(r, w, limit)
  remote._copy = monkeypatch_copy
  try:
    with remote.Mirror(url) as mirror:
      assert os.listdir(mirror.local) == ["config.json"]
  finally:
    remote._copy = original
  assert read == [sidefiles.CONFIG_BYTES]  # one copy, the config's, within its bound


def test_an_object_over_its_bound_is_found_over_it_and_set_aside_whole_in_the_bucket(
  gcs, monkeypatch
):
  url = new_url()
  whole = "".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in range(1, 200))
  remote._epath(f"{url}/metrics_train.jsonl").write_text(whole)
  monkeypatch.setitem(remote._RUN_FILES, layout.metrics_file("train"), 100)
  with remote.Mirror(url) as mirror:
    path = os.path.join(mirror.local, layout.metrics_file("train"))
    # Copied no further than one byte past the bound: its reader finds it
    # over the bound, as it would on a disk, and the trainer sets it aside.
    assert os.path.getsize(path) == 101
    sidefiles.set_aside(path, "larger than its bound")
    with open(path, "w") as f:
      f.write('{"step": 1}\n')
  # The part-copy never replaced anything: the bucket's whole object was
  # copied to the name it was set aside as, and the new file took its place.
  assert remote.read_bytes(f"{url}/metrics_train.jsonl.aside").decode() == whole
  assert remote.read_bytes(f"{url}/metrics_train.jsonl") == b'{"step": 1}\n'


@pytest.mark.parametrize("url", ["gs://runs/a/../b", "gs://runs/a/./b", "gs://runs//b", "gs:///b"])
def test_a_url_with_dot_segments_is_refused_before_anything_is_written(gcs, local_tmp, url):
  # gs://runs/a/../b trained with exit 0, its side files under a/../b/ and
  # its checkpoints under b/: every step then read as damaged.
  before = gcs.objects("runs")
  with pytest.raises(ConfigError, match=re.escape(f"{url}: a workdir URL with ")):
    train_lib.train_and_evaluate(to_train(tiny_experiment(num_train_steps=2)), url)
  with pytest.raises(ConfigError, match=re.escape(f"{url}: a workdir or an export URL with ")):
    compressive.load(url)
  assert gcs.objects("runs") == before and not mirrors_left(local_tmp)


# -- A storage call that never answers is an error, not a hang. ----------------------


def test_a_stalled_server_during_a_save_ends_the_trainer_within_the_deadline_nothing_lost(
  gcs, tmp_path
):
  """The server stopped (SIGSTOP) while a save is in flight, then SIGTERM:
  the trainer waited for the save with no deadline and did not act on the
  signal until storage answered. Now it ends within --storage_deadline
  with one line, and every checkpoint saved before reads back."""
  deadline = 15
  env = process_env(**gcs.env())
  config = write_config_file(
    tmp_path / "c.py",
    {
      "num_train_steps": 200,
      "checkpoint_every_steps": 1,
      "eval_every_steps": 0,
      "log_every_steps": 1,
    },
  )
  url = new_url()
  p = processes.start(
    [
      sys.executable,
      "train.py",
      f"--config={config}",
      f"--workdir={url}",
      f"--storage_deadline={deadline}",
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  lines = []
  for line in p.stderr:
    lines.append(line)
    if "checkpoint of step 3:" in line:
      break
  gcs.process.send_signal(signal.SIGSTOP)  # the next save waits on it
  try:
    time.sleep(2)
    p.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    _, err = p.communicate(timeout=deadline + 300)
    took = time.monotonic() - stopped
  finally:
    gcs.process.send_signal(signal.SIGCONT)
    if p.poll() is None:
      p.kill()
  # Within the deadline (from the save's start, before the signal) and a
  # loaded machine's slack; one error line, naming the save, exit 2.
  assert took < deadline + 60, (took, err[-3000:])
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
  assert "Cloud Storage did not answer within 15 s" in errors[0]
  assert "what was saved before is intact" in errors[0]
  # Nothing lost: each save finished before the stall (Orbax begins a save
  # once the one before is whole: steps 1 and 2 at least) is there, and the
  # newest reads back, verified; the one the stall cut short is not read.
  saved = {
    int(n.split("/")[1])
    for n in under(gcs, url)
    if n.startswith("checkpoints/")
    and n.split("/")[1].isdigit()
    and n.endswith("/commit_success.txt")
  }
  assert {1, 2} <= saved, sorted(saved)
  experiment, model = compressive.load(url)
  assert model is not None and experiment.train.num_train_steps == 200


def test_a_full_local_disk_under_a_mirror_names_the_copy_and_the_folder(
  gcs, local_tmp, monkeypatch
):
  url = new_url()
  remote._epath(f"{url}/config.json").write_text("{}")

  def full(read, write, limit=None):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(remote, "_copy", full)
  with pytest.raises(
    remote.StorageError,
    match=re.escape(f"cannot copy {url}/config.json to this machine's temporary folder "),
  ) as e:
    with remote.Mirror(url):
      pass
  assert "No space left on device (free space there, or set TMPDIR" in str(e.value)
  assert not mirrors_left(local_tmp)
