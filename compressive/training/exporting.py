"""Writing an export (export.py: what one holds, and how it is read): the
parameters of a workdir's checkpoint, read through the one door
(opening.open_run), and its config, into a new or empty folder, written
beside it and renamed into place when whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from typing import Any, Iterator, Optional

from flax import nnx
import orbax.checkpoint as ocp

from compressive import config as config_lib
from compressive.errors import CheckpointError, ConfigError
from compressive.training import export as export_lib
from compressive.training import inference, layout, opening, orbax_errors, runconfig
from compressive.training import integrity as integrity_lib


def check_output(output: str, workdir: layout.Where, label: Optional[str] = None) -> None:
  """ConfigError unless `output` can receive an export of `workdir`: a new
  folder, or an empty one, with a name the filesystem takes, and not inside
  the workdir's checkpoints. `label` names it in the message (default: the
  path)."""
  label = label or output
  if not output:
    raise ConfigError(f"{label or 'the output'} is empty: give the export's folder")
  name = os.path.basename(os.path.abspath(output))
  parent = os.path.dirname(os.path.abspath(output))
  limit = _name_max(parent)
  if len(os.fsencode(name)) > limit:
    raise ConfigError(
      f"{label}: the folder's name is {len(os.fsencode(name))} bytes long; this "
      f"filesystem takes at most {limit}"
    )
  if os.path.lexists(output):
    if not os.path.isdir(output):
      raise ConfigError(f"{label} exists and is not a folder: give a new or empty folder")
    if os.listdir(output):
      raise ConfigError(f"{label} exists and is not empty: give a new or empty folder")
  place = layout.workdir(workdir)
  target = os.path.realpath(output)
  source = os.path.realpath(place.root)
  checkpoints = dataclasses.replace(place, root=source).checkpoints
  if target == source or target == checkpoints or target.startswith(checkpoints + os.sep):
    raise ConfigError(
      f"{label} is inside the workdir {place.name}'s checkpoints: give a folder outside them"
    )


def export(workdir: layout.Where, output: str, step: Optional[int] = None) -> int:
  """Writes the parameters of `workdir`'s checkpoint `step` (default the
  newest) and its config to `output` (a new or empty folder); returns the step.

  The checkpoint is verified as it is read (checksums, finite values); the
  arrays are written as they are (same dtypes), from whatever mesh this
  machine's devices give.
  """
  check_output(output, workdir)
  place = layout.workdir(workdir)
  if export_lib.is_export(place):
    raise CheckpointError(
      f"{place.name} is an export already (parameters only), not a training workdir"
    )
  config = runconfig.load_config(workdir)  # as saved, which the export holds
  # Read through the one door, as a copy refitted to this machine's devices.
  reading = config.copy_and_resolve_references()
  config_lib.fit_mesh_to_devices(reading)
  run = opening.open_run(workdir, step, experiment=config_lib.check_to_read(reading))
  step = run.step
  identity = _identity_of(workdir, step, run.experiment)
  params = nnx.to_pure_dict(nnx.state(run.model))
  integrity = integrity_lib.fingerprint(params)
  output = os.path.abspath(output)
  parent = os.path.dirname(output)
  os.makedirs(parent, exist_ok=True)
  _remove_abandoned_partials(parent)
  # A short name of its own (an output's name may be as long as the
  # filesystem allows), found and removed by the next export if this
  # process is killed.
  partial = layout.Export.partial(parent, os.getpid())
  written = layout.Export(partial)
  shutil.rmtree(partial, ignore_errors=True)  # a previous attempt of this pid
  os.mkdir(partial)
  try:
    with _write_errors(output):
      with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(written.params, params)
      runconfig.write_config(partial, config.to_dict())  # as the run saved it
      manifest = {
        "format": export_lib.FORMAT,
        "version": export_lib.VERSION,
        "step": int(step),
        "source": place.url or os.path.abspath(place.root),
        "integrity": integrity,
        "identity": identity,
        "config_sha256": export_lib.file_digest(written.config),
      }
      manifest["sha256"] = export_lib.manifest_digest(manifest)
      with open(written.manifest, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
      os.replace(partial, output)  # onto an empty folder, or a new name
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  return int(step)


def _identity_of(workdir: layout.Where, step: int, experiment: Any) -> dict[str, Any]:
  """The identity to record in the export of `workdir`'s checkpoint `step`:
  the one the checkpoint recorded (just verified against this config), each
  part it left unknown taken from the experiment it was read as and the
  tokenizer here."""
  _, saved = inference.saved_identity(workdir, step)
  here = inference.reader_identity(experiment)
  saved = saved or {}
  identity = {
    part: saved.get(part) if saved.get(part) is not None else here.get(part)
    for part in integrity_lib.IDENTITY_PARTS
  }
  _, wrong = integrity_lib.field_problems(
    {"identity": identity}, {"identity": integrity_lib.IDENTITY_FIELDS}
  )
  if wrong:  # e.g. an old checkpoint's SentencePiece model not on this machine
    raise CheckpointError(
      f"cannot export {layout.workdir(workdir).name}: the run's identity is not known whole "
      f"({', '.join(wrong)}), and an export never records a null there; "
      "export it where its tokenizer can be read"
    )
  return identity


def _name_max(folder: str) -> int:
  """The longest file name (bytes) the filesystem of `folder` (or of its
  nearest existing ancestor) takes."""
  while folder and not os.path.isdir(folder):
    folder = os.path.dirname(folder)
  try:
    return os.pathconf(folder or "/", "PC_NAME_MAX")
  except (OSError, ValueError):
    return 255


def _remove_abandoned_partials(parent: str) -> None:
  """Removes what exports killed mid-write left in `parent`: partial folders
  whose process no longer runs."""
  for name in os.listdir(parent):
    if not name.startswith(layout.PARTIAL_EXPORT_PREFIX):
      continue
    try:
      pid = int(name[len(layout.PARTIAL_EXPORT_PREFIX) :])
      os.kill(pid, 0)
      continue  # another export is writing it
    except ProcessLookupError:
      pass
    except (ValueError, PermissionError):
      continue
    shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@contextlib.contextmanager
def _write_errors(output: str) -> Iterator[None]:
  """A write the disk refused (full, read-only, not ours), also when Orbax
  reports it from its threads, as one OSError naming the export."""
  try:
    yield
  except OSError:
    raise
  except Exception as e:
    code = orbax_errors.write_errno(e)
    if code is None:
      raise
    raise OSError(code, os.strerror(code), output) from None
