"""A storage call that never answers is an error, not a hang
(compressive/storage.py): a deadline on each call, the signals' handlers run
while it waits, and the local folders that stand for a store's run are
cleared once no process holds them, whatever ended their tool.

The Cloud Storage cases (a server stalled with SIGSTOP during a save,
TensorStore without credentials) are in tests/training/test_remote.py."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from compressive import cli_os_errors, storage
import processes

# Generous beside the deadlines below (a loaded 2-core machine wakes late),
# far below a hang.
SLACK_S = 30


@pytest.fixture(autouse=True)
def fresh_store(monkeypatch):
  monkeypatch.setattr(storage, "_stalled", [])  # each test's store answers until it does not


def test_a_call_that_never_answers_is_an_error_within_its_deadline():
  never = threading.Event()
  start = time.monotonic()
  with pytest.raises(
    storage.StorageTimeout,
    match=r"^saving checkpoint 4 in gs://b/r: Cloud "
    r"Storage did not answer within 1 s",
  ):
    storage.within(1.0, "saving checkpoint 4 in gs://b/r", never.wait)
  assert 1.0 <= time.monotonic() - start < 1.0 + SLACK_S
  # The store is taken as gone: the next call ends at once, named.
  start = time.monotonic()
  with pytest.raises(
    storage.StorageTimeout,
    match="not tried, Cloud Storage stopped answering "
    r"\(saving checkpoint 4",
  ):
    storage.within(60.0, "copying the run's files", lambda: None)
  assert time.monotonic() - start < SLACK_S and storage.stalled()


def test_a_call_that_answers_gives_its_value_or_its_error():
  assert storage.within(10.0, "x", lambda: 7) == 7
  with pytest.raises(KeyError, match="no object"):
    storage.within(10.0, "x", lambda: {}["no object"])
  assert storage.within(None, "x", lambda: 8) == 8  # no deadline: called here
  assert not storage.stalled()


def test_a_signal_is_heard_while_a_call_waits():
  # The waiting thread wakes every few tenths of a second: a handler that
  # raises (a second SIGTERM, Ctrl-C) ends the wait at once, long before
  # the deadline.
  def stop(signum, frame):
    raise KeyboardInterrupt

  previous = signal.signal(signal.SIGUSR1, stop)
  timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))
  timer.start()
  start = time.monotonic()
  try:
    with pytest.raises(KeyboardInterrupt):
      storage.within(600.0, "waiting", threading.Event().wait)
  finally:
    timer.cancel()
    signal.signal(signal.SIGUSR1, previous)
  assert time.monotonic() - start < SLACK_S


@pytest.mark.slow  # kill -9 of a process of its own
def test_a_mirror_folder_its_tool_left_when_killed_is_cleared_by_the_next(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this process's temporary folder
  code = (
    "import sys, time\nfrom compressive import storage\n"
    "f = storage.LocalFolder('compressive-mirror-', 'run')\n"
    "open(f.path + '/config.json', 'w').write('{}')\nprint(f.parent, flush=True)\n"
    "time.sleep(600)\n"
  )
  env = dict(os.environ, TMPDIR=str(tmp_path))
  holder = processes.start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
  try:
    left = holder.stdout.readline().strip()
    assert os.path.isdir(left)
    # Held: a second tool's start leaves it alone.
    assert storage.clear_left_behind("compressive-mirror-") == [] and os.path.isdir(left)
  finally:
    holder.kill()
    holder.communicate()
  # Its holder killed (SIGKILL: nothing of it ran): the next start clears it.
  other = storage.LocalFolder("compressive-mirror-", "run")
  try:
    assert not os.path.exists(left)
    assert os.listdir(tmp_path) == [os.path.basename(other.parent)]
  finally:
    other.close()
  assert os.listdir(tmp_path) == []


def test_an_object_a_storage_client_did_not_find_is_named_as_such():
  # The second of two trainers on one bucket ended with
  # `error: gs://runs/two/checkpoints/110`, which said nothing.
  assert cli_os_errors.describe_os_error(FileNotFoundError("gs://runs/two/checkpoints/110")) == (
    "gs://runs/two/checkpoints/110: not found on Cloud Storage (a workdir there has no lock: "
    "another process may have removed it)"
  )
