"""XLA_FLAGS that XLA would stop a tool on, found before JAX starts a
backend, so that each is one line and exit 2 (cli.parse_flags) instead of
XLA's own fatal line."""

from __future__ import annotations

import os
import sys
from typing import Optional


def xla_flags_problem(value: str) -> Optional[str]:
  """One line for an XLA_FLAGS that XLA would stop the process on in a way
  that can be seen before it starts (its own fatal line, exit by abort): a
  first word without `--`, which XLA reads as the name of a file of flags.
  A flag XLA does not know is XLA's to report."""
  words = value.split()
  if words and not words[0].startswith("--") and not os.path.isfile(words[0]):
    return (
      f"XLA_FLAGS={value!r}: each flag starts with -- (XLA reads a first word without "
      f"it, {words[0]!r}, as a file of flags, and there is none)"
    )
  return None


def xla_flags_unknown(value: str) -> Optional[str]:
  """One line for an XLA_FLAGS whose flag names XLA does not know, which it
  would report with its own fatal line and exit 1 when JAX starts its first
  backend; None if XLA accepts them, or where this cannot be asked ahead.

  XLA alone knows its flags, so it is asked: a forked copy of this process
  (JAX imported, no backend started yet, no thread running) starts JAX's
  CPU backend, which reads XLA_FLAGS and dies on a name it does not know,
  and its error line is read back. That takes a fraction of a second, only
  when XLA_FLAGS is set. JAX starts the CPU backend beside any accelerator's,
  so a flag the CPU backend refuses stops every run; where JAX_PLATFORMS
  leaves the CPU out, or there is no fork (not Linux), XLA reports it."""
  platforms = os.environ.get("JAX_PLATFORMS", "").split(",")
  if (
    not value.strip()
    or not sys.platform.startswith("linux")
    or platforms != [""]
    and "cpu" not in platforms
  ):
    return None
  read, write = os.pipe()
  pid = os.fork()
  if not pid:  # the copy: its output into the pipe, and nothing of it survives
    try:
      os.dup2(write, 1)
      os.dup2(write, 2)
      os.environ["XLA_FLAGS"] = value  # what XLA reads as its backend starts
      import jax

      jax.config.update("jax_platforms", "cpu")
      jax.devices()
    finally:  # XLA itself exits 1 on a name it does not know; anything else is the run's
      os._exit(0)  # no atexit handlers, no buffers of this process's flushed twice
  os.close(write)
  with os.fdopen(read, errors="replace") as f:
    said = f.read()
  _, status = os.waitpid(pid, 0)
  if os.waitstatus_to_exitcode(status) == 0:
    return None
  lines = [line.split("] ", 1)[-1] for line in said.splitlines() if "XLA_FLAGS" in line]
  why = lines[0] if lines else f"XLA stopped on it ({said.strip()[:200] or 'no message'})"
  return f"XLA_FLAGS={value!r}: {why}; correct or remove it (XLA would stop the run there)"
