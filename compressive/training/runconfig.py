"""A run's config.json, beside the checkpoints: written whole, read back only
as a regular file within a bound (sidefiles), and compared with the config
of a run that would resume in its workdir (the model fields that fix what a
checkpoint holds, and the run's shape), so that a resume with another
config is one line before anything is built. The checkpoints' own record of
the run (integrity.py) is what a resume finally trusts."""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping, TypeAlias

import ml_collections

from compressive import experiment as experiment_lib
from compressive import files, nested
from compressive.errors import CheckpointError, ConfigError
from compressive.experiment import Experiment
from compressive.training import integrity, layout, savedjson, sidefiles

# A saved config as read back (config.json), for `config.check_saved` to
# make ready and check: the code that reads a run's fields reads the checked
# Experiment's typed groups instead.
SavedConfig: TypeAlias = ml_collections.ConfigDict


def save_config(workdir: layout.Where, experiment: Experiment) -> None:
  """Writes WORKDIR/config.json whole from the experiment's groups
  (Experiment.to_dict: every field, as the run understands it)."""
  write_config(workdir, experiment.to_dict())


def write_config(workdir: layout.Where, fields: Mapping[str, Any]) -> None:
  """Writes WORKDIR/config.json (a config's fields, nested) whole (a
  temporary file renamed over it); a write the disk refuses names the file."""
  run = layout.workdir(workdir)
  os.makedirs(run.root, exist_ok=True)
  files.write_text(run.config, json.dumps(fields, indent=2) + "\n")


def load_config(workdir: layout.Where) -> SavedConfig:
  """The config saved in a workdir or an export; one line naming what is
  wrong when `workdir` is not a folder holding a readable config.json.
  CheckpointError when it cannot be read as a config: damaged, or not a
  regular file (a folder, a link, a FIFO: files.NotAFileError), or
  beyond sidefiles.CONFIG_BYTES."""
  run = layout.workdir(workdir)
  path, where = run.config, run.name
  if not os.path.lexists(run.root):
    raise FileNotFoundError(f"{where} does not exist: it is not a training workdir or an export")
  if not os.path.isdir(run.root):
    raise FileNotFoundError(
      f"{where} is a file, not a folder: give a training workdir or an export (the folder)"
    )
  if not os.path.lexists(path):
    raise FileNotFoundError(f"{run.public(path)} not found: {where} is not a training workdir")
  try:
    fields = _tuples(savedjson.parse(files.read_bytes(path, sidefiles.CONFIG_BYTES), path))
    experiment_lib.check_written(fields)  # its sections, fields and kinds: not its ranges
    return ml_collections.ConfigDict(fields)
  except savedjson.DamagedJSONError as e:
    cause = e.cause
  except ConfigError as e:
    cause = str(e)
  except (ValueError, TypeError, KeyError, AttributeError) as e:  # keys a config refuses
    cause = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
  raise CheckpointError(
    f"{run.public(path)} is damaged ({cause}); restore it from a copy, or write it again "
    "with the run's config"
  )


def _tuples(value: Any) -> Any:
  """JSON turns tuples into lists; configs use tuples for fixed-size fields."""
  if isinstance(value, dict):
    dotted = [k for k in value if "." in k]
    if dotted:  # a hand edit ("model.num_layers": 2): a config's keys are names
      raise ValueError(
        f"a key with a dot in it, {dotted[0][:80]!r}: a config nests its sections instead"
      )
    return {k: _tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def differences(workdir: layout.Where, experiment: Experiment) -> list[str]:
  """ "FIELD SAVED -> GIVEN" for each field of the workdir's config.json that
  `experiment` gives another value (none when config.json cannot be read)."""
  try:
    saved = json.loads(json.dumps(load_config(workdir).to_dict()))
  except (OSError, CheckpointError):
    return []
  given = json.loads(json.dumps(experiment.to_dict()))  # tuples as JSON lists, as saved
  a, b = nested.flatten(saved), nested.flatten(given)
  return [
    f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
  ]


# Config fields outside the model that fix the shapes of what a checkpoint
# holds besides the parameters (optimizer state, memory rows, data position):
# resuming with other values cannot work, and is reported by name. The model
# fields are derived (integrity.model_differences, the one rule the
# checkpoints' identity check keeps too).
RUN_SHAPE_FIELDS = ("batch_size", "optimizer.name", "data.source", "data.tokenizer", "seed")


def check_resume_config(workdir: layout.Where, experiment: Experiment) -> None:
  """ConfigError naming the fields that differ from the run being resumed.

  A config.json that cannot be read (a crash or a full disk while it was
  written by an older version, an edit, or more than
  sidefiles.CONFIG_BYTES) is set aside as
  config.json.damaged with a warning: the checkpoints, which record the
  model config they were saved with, decide whether the run resumes, and
  the trainer writes config.json again."""
  run = layout.workdir(workdir)
  path = run.config
  if not os.path.lexists(path):
    return
  try:
    saved = load_config(workdir)
  except CheckpointError as e:
    aside = layout.damaged(path)
    os.replace(path, aside)
    logging.getLogger("compressive").warning(
      "%s; set aside as %s, and written again", e, run.public(aside)
    )
    return

  was, now = nested.flatten(saved), nested.flatten(experiment.to_dict())  # each a leaf
  diffs = integrity.model_differences(saved.get("model") or {}, experiment.model) + [
    f"{name} {was.get(name)!r} -> {now.get(name)!r}"
    for name in RUN_SHAPE_FIELDS
    if was.get(name) != now.get(name)
  ]
  if diffs:
    raise ConfigError(
      f"{run.name} holds checkpoints of a different run: "
      + "; ".join(diffs)
      + ". Use another --workdir, or the same values to resume"
    )
