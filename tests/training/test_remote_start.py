"""A gs:// start's wait for Cloud Storage (compressive/reach.py), without a
server: bounded, saying that it waits; TensorStore's log lines kept off the
console while the rest of what is written there gets through.
(tests/training/test_remote.py starts the server.)"""

import os
import threading
import time

import pytest

from compressive import reach, storage


def test_the_wait_for_an_answer_is_bounded_and_says_that_it_waits(monkeypatch):
  monkeypatch.setattr(storage, "PROGRESS_S", 0.1)
  monkeypatch.setattr(storage, "_stalled", [])  # this test's store stalls; no other's
  said = []
  release = threading.Event()
  start = time.monotonic()
  with pytest.raises(storage.StorageTimeout) as e:
    reach.bounded(lambda: release.wait(30), "gs://b/run", 0.45, said.append)
  release.set()
  assert time.monotonic() - start < 5
  assert str(e.value) == (
    "reading gs://b/run: Cloud Storage did not answer within 0.45 s "
    "(--storage_deadline); what was saved before is intact"
  )
  assert 3 <= len(said) <= 5 and all(
    line.startswith("still waiting for Cloud Storage (gs://b/run): ") for line in said
  ), said
  monkeypatch.setattr(storage, "_stalled", [])
  # An answer in time is the answer; a client's error is its own.
  assert reach.bounded(lambda: 7, "gs://b/run", 5, said.append) == 7

  def refuses():
    raise PermissionError("403 Forbidden")

  with pytest.raises(PermissionError, match="403 Forbidden"):
    reach.bounded(refuses, "gs://b/run", 5)


def test_tensorstores_lines_stay_off_the_console_and_the_rest_gets_through(capfd):
  with reach.captured_stderr() as (lines, say):
    os.write(
      2,
      b"I1205 09:10:57.054914    1948 google_auth_provider.cc:136] Using "
      b"GOOGLE_AUTH_TOKEN_FOR_TESTING\n",
    )
    os.write(2, b"a line of someone else\n")
    say("still waiting for Cloud Storage (gs://b/run): 10 s of at most 90")
  err = capfd.readouterr().err
  assert "google_auth_provider" not in err and "a line of someone else" in err
  assert "warning: still waiting for Cloud Storage (gs://b/run): 10 s of at most 90" in err
  assert lines[0].endswith("Using GOOGLE_AUTH_TOKEN_FOR_TESTING")
