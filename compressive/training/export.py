"""Parameters-only exports of a training checkpoint: what inference needs.

An export is a folder holding

  config.json   the training run's config, as the workdir holds it;
  params/       the model's parameters (Orbax StandardCheckpointer): no
                optimizer state, no memory, no data position;
  export.json   {"format": "compressive-params", "version": 2, "step": N,
                 "source": the workdir, "integrity": checksums of params/,
                 "identity": the run's identity as its checkpoint recorded
                 it (the model config, the tokenizer's digest, the data
                 config's generating fields, the corpus's digest),
                 "config_sha256": config.json's digest, "sha256": this
                 record's own digest}.

It is written (exporting.py) into a temporary folder beside its destination
and renamed into place when complete, so a folder named as the output is
either a whole export or untouched. `compressive.load(folder)` reads it as
it reads a workdir; the checksums are verified on every load, like a
checkpoint's, and the identity is compared as a checkpoint's is: a
SentencePiece model retrained in place since the export, or another model
or data config, is refused by every reader. A version 2 export.json lacking
any of its fields, or holding a null where a check value belongs, is
damaged, never read as version 1's; version 1 exports (no identity) are not
read at all.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any, Optional

import jax
import orbax.checkpoint as ocp

from compressive import files, remote
from compressive.errors import CheckpointError
from compressive.scale import sharding
from compressive.training import checkpoint as ckpt_lib
from compressive.training import integrity as integrity_lib
from compressive.training import layout, savedjson, sidefiles, trees

if TYPE_CHECKING:  # open_export's argument, named for the type checker only
  from compressive import experiment as experiment_lib

FORMAT = "compressive-params"
VERSION = 2
# What every export.json of the version read holds, and of what type (a
# null is damage wherever a check value belongs; the identity's corpus
# digest is null for a source without one).
FIELDS = {
  "step": int,
  "integrity": {"sums": dict},
  "identity": integrity_lib.IDENTITY_FIELDS,
  "config_sha256": str,
  "sha256": str,
}
# Every field an export.json of the version read holds (exporting.py writes
# them): any other is damage, never read.
WRITTEN = ("format", "version", "source", *FIELDS)
# layout.py's names, as the messages and callers know them.


def is_export(path: layout.Where) -> bool:
  """Whether `path` is an export (rather than a training workdir)."""
  return os.path.lexists(layout.export(path).manifest)


def _check_version(name: str, version: Any) -> None:
  """CheckpointError unless `version` is the one this code reads. Version 1
  (the first two days of exports) recorded no identity, and optionally no
  digests: it cannot be told from a version 2 export rewritten without its
  checks, so it is not read (docs/LONG_RUNS.md); its workdir exports again."""
  is_int = isinstance(version, int) and not isinstance(version, bool)
  if is_int and version > VERSION:
    raise CheckpointError(
      f"{name} is export format version {version}; this version of "
      f"compressive reads version {VERSION}"
    )
  if version == 1 and is_int:
    raise CheckpointError(
      f"{name} is export format version 1, which recorded neither the "
      "run's identity nor always its digests, and cannot be told from a "
      "newer export stripped of them: it is not read; export the workdir "
      "again"
    )
  if version != VERSION or not is_int:
    raise CheckpointError(
      f"{name} is damaged: its version is {version!r}; export the workdir again"
    )


def read_manifest(path: layout.Where) -> dict[str, Any]:
  """export.json of the export at `path`, checked (savedjson: any failure to
  parse it is damage; FIELDS: a field missing or null is damage; its digest
  and config.json's are compared); CheckpointError in one line if not."""
  place = layout.export(path)
  name = place.manifest
  try:
    manifest = savedjson.read(name, dict, sidefiles.CONFIG_BYTES)
  except savedjson.DamagedJSONError as e:
    raise CheckpointError(f"{e}; export the workdir again") from None
  if manifest.get("format") != FORMAT:
    raise CheckpointError(f"{name} is not a compressive export (format {FORMAT!r})")
  _check_version(name, manifest.get("version"))
  missing, wrong = integrity_lib.field_problems(manifest, FIELDS)
  if missing or wrong:
    held = f"it lacks {', '.join(missing)}" if missing else f"it holds {', '.join(wrong)}"
    raise CheckpointError(
      f"{name} is damaged: {held} (every export of version {VERSION} "
      f"{'holds it' if missing else 'holds a value there'}); export the "
      "workdir again"
    )
  unknown = sorted(str(k) for k in manifest if k not in WRITTEN)
  problem = (
    f"{unknown[0][:80]!r}, a field no export of version {VERSION} holds"
    if unknown
    else integrity_lib.identity_problem(manifest["identity"])
  )
  if problem:
    raise CheckpointError(f"{name} is damaged: its {problem}; export the workdir again")
  config_path = place.config
  if files.kind(config_path) != "file":
    raise CheckpointError(
      f"export {place.name} is damaged: its {layout.CONFIG_FILE} is missing or "
      "not a file; export the workdir again"
    )
  # The manifest itself and the config beside it must be as written (an
  # edit is refused, by name).
  if manifest["sha256"] != manifest_digest(manifest):
    raise CheckpointError(
      f"{name} was changed since it was written (its digest differs); export the workdir again"
    )
  if manifest["config_sha256"] != file_digest(config_path):
    raise CheckpointError(
      f"{config_path} was changed since the export was written (its digest "
      "differs from export.json's); export the workdir again"
    )
  return manifest


def manifest_digest(manifest: dict[str, Any]) -> str:
  return integrity_lib.json_digest({k: v for k, v in manifest.items() if k != "sha256"})


def file_digest(path: str) -> Optional[str]:
  """The digest of the regular file at `path` (never through a link, never
  past a config's bound); None when there is none there."""
  try:
    return hashlib.sha256(files.read_bytes(path, sidefiles.CONFIG_BYTES)).hexdigest()
  except (FileNotFoundError, files.NotAFileError):
    return None


def check_identity(path: layout.Where, experiment: Any, step: Optional[int] = None) -> None:
  """RunMismatchError, before any corpus is read or model built, when the
  experiment (the saved config, as a reader made it ready) is not the one the
  export at `path`, or the workdir's checkpoint `step` (default the
  newest), was saved with: an edited config.json's model or data section,
  or a tokenizer retrained in place. The load compares the same again."""
  from compressive.training import inference

  place = layout.export(path)
  if is_export(path):
    where, saved = f"export {place.name}", read_manifest(path).get("identity")
  else:
    where, saved = inference.saved_identity(path, step)
  integrity_lib.compare_identity(where, saved, inference.reader_identity(experiment), ())


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """{path: shape} of the arrays (or their metadata) in `tree`; ValueError
  for a leaf that is none (metadata Orbax could not read)."""
  leaves = jax.tree_util.tree_leaves_with_path(
    tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict)
  )
  if not leaves or any(not hasattr(x, "shape") for _, x in leaves):
    raise ValueError(f"no parameters' shapes in {layout.PARAMS_DIR}/")
  return {sharding.path_str(p): tuple(int(n) for n in x.shape) for p, x in leaves}


def _check_shapes(path: layout.Where, saved: dict[str, tuple[int, ...]], wanted: Any) -> None:
  place = layout.export(path)
  wanted = _shapes(wanted)
  if saved == wanted:
    return
  diffs = [f"{n} {saved[n]} -> {wanted[n]}" for n in wanted if n in saved and saved[n] != wanted[n]]
  missing = [n for n in wanted if n not in saved]
  extra = [n for n in saved if n not in wanted]
  parts = (
    [f"{len(diffs)} have other shapes, saved -> config: " + "; ".join(diffs[:3])] if diffs else []
  )
  if missing:
    parts.append("not in the export: " + ", ".join(missing[:3]))
  if extra:
    parts.append("only in the export: " + ", ".join(extra[:3]))
  raise ckpt_lib.ShapeMismatchError(
    f"parameter shapes differ between export {place.name} and the config's model "
    f"({'; '.join(parts)}): use the export's own config (config.json)"
  )


def manifest_of_step(path: layout.Where, step: Optional[int] = None) -> dict[str, Any]:
  """The export's manifest (read_manifest); MissingStepError unless `step`
  is None or the exported step."""
  place = layout.export(path)
  manifest = read_manifest(path)
  if step is not None and step != manifest["step"]:
    raise ckpt_lib.MissingStepError(
      f"{place.name} is an export of step {manifest['step']} only, not of step {step}"
    )
  return manifest


def open_export(
  path: layout.Where, experiment: experiment_lib.Experiment, step: Optional[int] = None
) -> tuple[Any, int]:
  """(model, step) of the export at `path`, its parameters restored onto
  the run's setup (setup.build_setup: the experiment's shapes on its mesh)
  and verified: the step (`step`, if given, must be the exported one), the
  run's identity, the shapes and the checksums."""
  from compressive.training import inference
  from compressive.training import setup as setup_lib

  place = layout.export(path)
  manifest = manifest_of_step(path, step)
  # The run's identity, as a checkpoint's is compared: another tokenizer
  # (a SentencePiece model retrained in place), model or data config.
  integrity_lib.compare_identity(
    f"export {place.name}", manifest.get("identity"), inference.reader_identity(experiment), ()
  )
  setup = setup_lib.build_setup(experiment)
  params = _read_params(path, setup.abstract_state.params, setup.layout.state.params)
  got = integrity_lib.fingerprint(params)
  recorded = manifest["integrity"].get("sums")
  recorded = recorded if isinstance(recorded, dict) else {}
  bad = [name for name, sums in got["sums"].items() if recorded.get(name) != sums]
  if bad:
    raise CheckpointError(
      f"export {place.name} is damaged: {len(bad)} array(s) differ from the checksums saved with "
      f"them ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); export the workdir again"
    )
  return inference.model_of(setup, params), manifest["step"]


def _read_params(path: layout.Where, abstract_params: Any, shardings: Any) -> Any:
  """The parameters in the export's params/, onto `shardings`, after their
  shapes are compared with the config's; CheckpointError (one line) when
  they cannot be read."""
  place = layout.export(path)
  # Orbax reads a relative folder's metadata as missing: give it the
  # absolute one (the messages keep the path as the user gave it).
  where = place.params
  where = where if remote.is_remote(where) else os.path.abspath(where)
  if not remote.isdir(where):
    raise CheckpointError(
      f"export {place.name} is damaged: its {layout.PARAMS_DIR}/ folder is missing; "
      "export the workdir again"
    )
  with ocp.StandardCheckpointer() as checkpointer:
    try:
      saved = checkpointer.metadata(where)
      saved = _shapes(getattr(saved, "item_metadata", None) or getattr(saved, "tree", saved))
    except Exception as e:  # Orbax raises many kinds on missing or bad files
      raise CheckpointError(
        f"export {place.name} is damaged ({type(e).__name__}: "
        f"{str(e).splitlines()[0][:200] if str(e) else ''}); "
        "export the workdir again"
      ) from e
    _check_shapes(path, saved, abstract_params)
    try:
      return checkpointer.restore(where, trees.abstract(abstract_params, shardings))
    except Exception as e:
      raise CheckpointError(
        f"export {place.name} is damaged ({type(e).__name__}: "
        f"{str(e).splitlines()[0][:200] if str(e) else ''}); "
        "export the workdir again"
      ) from e
