"""Joining the processes of a multi-host run (JAX's distributed runtime),
within stated bounds: every process waits `timeout_s` (train.py's
--join_timeout, 120 s by default) for the others to join, and the others take
a process whose heartbeats stop for HEARTBEAT_TIMEOUT_S as gone. The
entry points call `initialize_distributed` before anything else touches JAX.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import jax

from compressive import cli_flags, values
from compressive.errors import ConfigError, UserError


def check_distributed_values(
  coordinator_address: object, num_processes: object, process_id: object
) -> None:
  """ConfigError naming the value unless coordinator_address is HOST:PORT
  (port in [1, 65535]), num_processes >= 1 and process_id in [0,
  num_processes): before JAX waits for processes that cannot come."""
  host, _, port = str(coordinator_address).rpartition(":")
  if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ConfigError(
      f"coordinator_address={coordinator_address!r} must be HOST:PORT with a port in [1, 65535]"
    )
  values.integer("num_processes", num_processes, "[1, 2**31)", must="an integer >= 1")
  values.integer(
    "process_id",
    process_id,
    f"[0, {num_processes})",
    must=f"an integer in [0, num_processes={num_processes})",
  )


_joining: list[str] = []  # "asked", then "joined", as initialize_distributed goes


def join_unfinished() -> bool:
  """Whether this process began to join a run of several processes and has
  not (a stop or a failure while it waited): its exit must not wait for
  JAX's shutdown, which waits for processes that never joined."""
  return _joining == ["asked"]


# Seconds the processes of a run wait for each other by default: to join
# (every one of them, at the start), and a process's heartbeats go missing
# before the others take it as gone (JAX's own: 300 and 100).
JOIN_TIMEOUT_S = 120
HEARTBEAT_TIMEOUT_S = 60
# JAX's own wait to join is this much longer than ours, which ends first,
# with one line: JAX's ends the process with a fatal log and a stack dump.
_JAX_LATER_S = 60


def join_as_flagged() -> bool:
  """Joins the run's other processes as the tool's multi-host flags say
  (cli_flags.define_multihost_flags): the one way train.py and the reading
  tools join JAX's distributed runtime; a tool without those flags runs
  alone. Returns whether it joined."""
  arguments = cli_flags.multihost_arguments()
  return arguments is not None and initialize_distributed(**arguments)


def initialize_distributed(
  *,
  auto: bool = False,
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
  timeout_s: int = JOIN_TIMEOUT_S,
) -> bool:
  """Joins JAX's distributed runtime; call before anything else uses JAX.

  `auto`: let JAX detect the cluster (Cloud TPU pod slices, SLURM, Open MPI,
  ...). Explicit `coordinator_address` ('host:port' of process 0),
  `num_processes` and `process_id` work anywhere, localhost included (CPU
  processes then talk through Gloo). Returns whether it initialised.
  `timeout_s`: how long every process waits for the others to join, and a
  stopping one for them to leave; a process whose heartbeats stop for
  HEARTBEAT_TIMEOUT_S is gone for the others. A run that cannot be joined
  in time is one line (UserError).
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ConfigError(
        "give all of coordinator_address, num_processes and process_id, or none "
        "(then multihost auto-detects the cluster)"
      )
    check_distributed_values(coordinator_address, num_processes, process_id)
  elif not auto:
    return False
  _joining[:] = ["asked"]
  where = f" at {coordinator_address}" if coordinator_address else ""
  _join(coordinator_address, num_processes, process_id, timeout_s, where)
  _joining.append("joined")
  return True


def _join(
  coordinator_address: Optional[str],
  num_processes: Optional[int],
  process_id: Optional[int],
  timeout_s: int,
  where: str,
) -> None:
  """jax.distributed.initialize on a thread of its own, waited for in
  slices (a stop signal's handler runs between them) for at most
  `timeout_s`: a UserError, naming the coordinator (`where`: " at
  HOST:PORT", or ""), when the processes do not all join in time or JAX
  cannot join them."""
  outcome: list[BaseException] = []
  done = threading.Event()

  def join() -> None:  # JAX's own wait ends the process (a fatal log) when it times out: later
    try:
      jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout_s + _JAX_LATER_S,
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
        shutdown_timeout_seconds=timeout_s,
      )
    except BaseException as e:  # handed to the waiting thread
      outcome.append(e)
    finally:
      done.set()

  threading.Thread(target=join, name="compressive-join", daemon=True).start()
  end = time.monotonic() + timeout_s
  while not done.wait(0.2):  # a stop signal's handler runs between the slices
    if time.monotonic() >= end:
      raise UserError(
        f"the run's processes did not all join within {timeout_s} s{where} "
        "(--join_timeout): start the same command on every host, each with "
        "its own --process_id"
      )
  if outcome:
    cause = " ".join(str(outcome[0]).split())[:200] or type(outcome[0]).__name__
    raise UserError(f"cannot join the run's processes{where}: {cause}") from outcome[0]
