"""What a checkpoint records to verify itself, and the verification.

Every save writes an integrity record beside its arrays: a fingerprint of
each array (two wrapping uint32 sums of its bits, one position-weighted;
integer sums are exact in any order, so the fingerprint is the same on any
mesh), which arrays are not finite, a digest of the data position, and the
run's identity (the model config, the tokenizer, the corpus). Every restore
recomputes and compares them (`verify`), so flipped bytes, truncated files,
NaNs and another run's checkpoint are named instead of restored. Records
name their version (`RECORD_VERSION`) and are read only as a version this
code knows; a field missing from one, a null where a check value belongs, a
field no version records, or a value of another kind, is damage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from compressive import nested, values
from compressive.errors import CheckpointError, ConfigError


class RunMismatchError(CheckpointError):
  """The checkpoint was saved by a run with another model config, tokenizer
  or corpus than the one restoring it: not damage, so --restore_intact
  never skips it."""


class DamagedCheckpointError(CheckpointError):
  """Files missing, truncated or unreadable, a checksum that differs from the
  one recorded at save time, or non-finite parameters / optimizer state."""


class UnknownRecordError(CheckpointError):
  """An integrity record of a version this code does not read: a newer one,
  or one that names no version (before version 2, or a newer one stripped of
  it: the two cannot be told apart). Not damage: --restore_intact never
  moves such a step aside."""


def json_digest(value: Any) -> str:
  """sha256 of a JSON value in one canonical form (sorted keys, no spaces)."""
  canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(canonical.encode()).hexdigest()


# The integrity record's format. Version 2 records name their version and
# hold every field below; a field missing from one is damage. Records that
# name no version were written before version 2: they held no data config
# and no corpus digest, exactly what a version 2 record stripped of its
# version and those parts holds, so they are not read (UnknownRecordError),
# as version 1 exports are not.
RECORD_VERSION = 2
IDENTITY_PARTS = ("model", "tokenizer", "data", "corpus")


def run_identity(
  model: Any,
  tokenizer_identity: Optional[str] = None,
  corpus: Optional[str] = None,
  data: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
  """What a checkpoint's numbers mean beyond their shapes: the model config
  (`model`: the run's ModelConfig, every field recorded as JSON; a post-norm
  model read as pre-norm has the same shapes), the tokenizer
  (a SentencePiece model retrained in place keeps its vocabulary size), the
  data config's generating fields (`data`: data.source and its section
  without the fields that only say where the files are, so another
  data.synthetic.seed is another corpus) and, for training, the corpus's
  content digest (`corpus`: a folder whose files changed). Every part is
  present. A reader leaves the parts it cannot know None (not compared); a
  checkpoint records each but the corpus, which is None only for a source
  without a digest (record())."""
  return {
    "model": json.loads(json.dumps(dataclasses.asdict(model))),
    "tokenizer": tokenizer_identity,
    "data": data,
    "corpus": corpus,
  }


# How the model runs, not what it computes: these may change between the
# run that saved a checkpoint and one that restores it.
RUNTIME_MODEL_FIELDS = frozenset(
  (
    "dtype",
    "remat",
    "attention_chunk_size",
    "attention_implementation",
    "dropout_rate",
    "scan_layers",
    "memory_gradient",
  )
)

_WHAT = {
  "model": "the model config",
  "tokenizer": "the tokenizer",
  "data": "the data config",
  "corpus": "the training corpus",
}
_FIX = {
  "model": "config.json was edited, or the workdir holds another run's config: restore the "
  "run's config.json",
  "tokenizer": "the SentencePiece model (data.spm_model) was changed or retrained since: use "
  "the model the run was trained with",
  "data": "the data section is not the run's (config.json edited, or another --config): "
  "restore the run's data config, or, resuming, pass --accept_changed_corpus to go "
  "on training on other data deliberately",
  "corpus": "files were added, removed or changed since: restore the corpus, or pass "
  "--accept_changed_corpus to go on training on it deliberately",
}


def _model_fields(model: Any) -> dict[str, Any]:
  """Every field of a model section (a ModelConfig, or a mapping as a
  saved config holds it), those it left out at their defaults: a config
  written before a field existed ran with its default. A section this
  version cannot read is compared as it is written."""
  from compressive.model.config import ModelConfig

  try:
    return dataclasses.asdict(ModelConfig.from_config(model))
  except (ConfigError, TypeError):
    return dict(model.to_dict()) if hasattr(model, "to_dict") else dict(model or {})


def _parameter_shapes(fields: dict[str, Any]) -> dict[str, tuple[int, ...]]:
  """{parameter path: shape} of the model `fields` build (abstract: nothing
  is allocated)."""
  from flax import nnx

  from compressive.model.config import ModelConfig
  from compressive.model.transformer import CompressiveTransformer

  model = nnx.eval_shape(lambda: CompressiveTransformer(ModelConfig(**fields), rngs=nnx.Rngs(0)))
  return {
    "/".join(str(k) for k in path): tuple(var.get_value().shape)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
  }


def model_differences(saved: Any, current: Any) -> list[str]:
  """The one rule for which model fields a checkpoint's run fixes, as
  "model.FIELD SAVED -> CURRENT": every field of the two model sections
  (their defaults filled in) that differs, but the run-time knobs
  (RUNTIME_MODEL_FIELDS), unless a knob's change alone gives the saved model
  another parameter tree (scan_layers stacks the layers). The resume check
  (runconfig.py) and the identity check of every restore keep it."""
  a, b = _model_fields(saved), _model_fields(current)
  differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
  names = [k for k in differ if k not in RUNTIME_MODEL_FIELDS]
  knobs = [k for k in differ if k in RUNTIME_MODEL_FIELDS]
  if knobs and not names:
    try:
      tree = _parameter_shapes(a)
      if _parameter_shapes(b) != tree:
        names = [k for k in knobs if _parameter_shapes({**a, k: b[k]}) != tree] or knobs
    except (ConfigError, TypeError):  # a config of another version: the knobs may matter
      names = knobs
  return [f"model.{k} {a.get(k)!r} -> {b.get(k)!r}" for k in differ if k in names]


def _differences(part: str, a: Any, b: Any) -> Optional[str]:
  """What differs between the saved `a` and current `b` of a part, or None
  when nothing that matters does (model_differences: the model's run-time
  knobs, a field left out at its default)."""
  if part == "model" and isinstance(a, dict) and isinstance(b, dict):
    return "; ".join(model_differences(a, b)[:4]) or None
  if part == "data" and isinstance(a, dict) and isinstance(b, dict):
    fa, fb = nested.flatten(a, "data."), nested.flatten(b, "data.")
    fields = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    if not fields:
      return None
    return "; ".join(f"{k} {fa.get(k)!r} -> {fb.get(k)!r}" for k in fields[:4])
  return f"{'none recorded' if a is None else a} -> {b}"


def compare_identity(
  where: str,
  saved: Optional[dict[str, Any]],
  current: Optional[dict[str, Any]],
  accept: tuple[str, ...],
) -> None:
  """RunMismatchError naming what differs between the saved and the current
  identity. `where` names what was saved ("checkpoint DIR/6", "export DIR").
  A part unknown here (None) is not compared. A corpus digest recorded as
  null (a source without one) differs from one measured here: a null never
  turns the check off (a record holds every other part: check_record)."""
  if not saved or not current:
    return
  for part in IDENTITY_PARTS:
    a, b = saved.get(part), current.get(part)
    if b is None or a == b or (a is None and part != "corpus"):
      continue
    what = _differences(part, a, b)
    if what is None:
      continue
    message = f"{_WHAT[part]} differs from the one {where} was saved with ({what}): {_FIX[part]}"
    if part in accept:
      logging.getLogger("compressive").warning("%s (accepted)", message.split(": ")[0])
      continue
    raise RunMismatchError(message)


def record(state: Any, memory: Any, data_json: Any, identity: dict[str, Any]) -> dict[str, Any]:
  """The integrity record of a save: its version, the fingerprint of
  `state` and of the stored `memory` fields, the digest of the data
  position `data_json`, and `identity` (`run_identity`, every part known
  but a corpus digest: IDENTITY_FIELDS), which restores compare. A record
  never holds a null where a check value belongs (check_record)."""
  missing, wrong = field_problems({"identity": identity}, {"identity": IDENTITY_FIELDS})
  if missing or wrong:
    raise ValueError(f"a checkpoint's identity holds every part: {', '.join(missing + wrong)}")
  result: dict[str, Any] = {"version": RECORD_VERSION}
  result.update(fingerprint({"state": state, "memory": memory or {}}))
  result["data_sha256"] = json_digest(data_json)
  result["identity"] = identity
  return result


# What a record of each version holds, and of what type (a tuple allows
# each type in it): null is damage wherever a check value belongs, except a
# corpus digest, which a source without one records as null. A record that
# names no version held an identity of the model config
# and the tokenizer, the corpus's digest only when its source had one.
_NULLABLE = (str, type(None))
IDENTITY_FIELDS = {"model": dict, "tokenizer": str, "data": dict, "corpus": _NULLABLE}
RECORD_FIELDS = {
  2: {"sums": dict, "nonfinite": list, "data_sha256": str, "identity": IDENTITY_FIELDS},
}
_NAMES = {dict: "a mapping", list: "a list", str: "a string", int: "an integer"}


def field_problems(value: dict, fields: dict, prefix: str = "") -> tuple[list[str], list[str]]:
  """(the fields of `fields` that `value` lacks, those it holds as null or as
  another type: "identity.data null"); `fields` maps a name to its type, a
  tuple of types, or the fields of a mapping."""
  missing: list[str] = []
  wrong: list[str] = []
  for name, kind in fields.items():
    if name not in value:
      missing.append(prefix + name)
      continue
    item = value[name]
    if isinstance(kind, dict):
      if isinstance(item, dict):
        more = field_problems(item, kind, f"{prefix}{name}.")
        missing, wrong = missing + more[0], wrong + more[1]
        continue
      kind = dict
    if not isinstance(item, kind) or (isinstance(item, bool) and kind is int):
      wrong.append(
        f"{prefix}{name} " + ("null" if item is None else f"not {_NAMES.get(kind, 'of its type')}")
      )
  return missing, wrong


def _record_version(where: str, saved: Any, advice: str) -> int:
  """The version the integrity record `saved` names; damage for no record
  or a version that is no version, UnknownRecordError for a newer one and
  for none named."""
  if not isinstance(saved, dict):
    raise DamagedCheckpointError(
      f"checkpoint {where} is damaged: its integrity record holds no fields; {advice}"
    )
  version = saved.get("version")
  is_int = isinstance(version, int) and not isinstance(version, bool)
  if isinstance(version, int) and is_int and version in RECORD_FIELDS:
    return version
  if "version" not in saved:
    raise UnknownRecordError(
      f"checkpoint {where} is not read: its integrity record names no version, as records "
      "written before version 2 (before 2026-12-02) did and as a newer one stripped of its "
      "checks would, and the two cannot be told apart (docs/LONG_RUNS.md §Long runs: "
      "nothing lost)"
    )
  if isinstance(version, int) and is_int and version > RECORD_VERSION:
    raise UnknownRecordError(
      f"checkpoint {where} was written by a newer version of compressive (integrity record "
      f"version {version}; this one reads version {RECORD_VERSION}): update compressive to "
      "read it"
    )
  raise DamagedCheckpointError(
    f"checkpoint {where} is damaged: its integrity record's version is {version!r}; {advice}"
  )


def check_record(where: str, saved: Any, advice: str) -> None:
  """DamagedCheckpointError unless the integrity record `saved` holds every
  field of its version, each of its type (RECORD_FIELDS: a missing field,
  or a null where a check value belongs, is damage, never an older format),
  and an identity whose parts hold only what a version records
  (identity_problem); UnknownRecordError for a version this code does not
  read."""
  version = _record_version(where, saved, advice)
  missing, wrong = field_problems(saved, RECORD_FIELDS[version])
  if missing or wrong:
    held = f"lacks {', '.join(missing)}" if missing else f"holds {', '.join(wrong)}"
    raise DamagedCheckpointError(
      f"checkpoint {where} is damaged: its integrity record {held} (a record of version "
      f"{version} {'always holds it' if missing else 'holds a value there'}); {advice}"
    )
  problem = identity_problem(saved["identity"])
  if problem:
    raise DamagedCheckpointError(
      f"checkpoint {where} is damaged: its integrity record's {problem}; {advice}"
    )


def identity_problem(identity: dict) -> Optional[str]:
  """What a recorded identity (a checkpoint's or an export's, whose parts
  are of their types: field_problems) holds that no version records, in
  words: a model field ModelConfig does not know or a value of another
  kind, a data section other than data.source's, a field that section does
  not know or does not record (where its files are); None when nothing."""
  from compressive.data import registry
  from compressive.model.config import ModelConfig

  try:
    values.check_section(ModelConfig, identity["model"], "identity.model.")
    data = identity["data"]
    source = data.get("source")
    if not isinstance(source, str):
      return f"identity.data.source={source!r} is not a source's name"
    for key, section in data.items():
      if key == "source" or ":" in source or source not in registry.names():
        continue  # a plugin's section: its schema is known once it is imported
      if key != source:
        return f"identity.data.{key} is not the section of data.source={source!r}"
      values.check_section(
        registry.get(source).schema,
        section,
        f"identity.data.{key}.",
        derived=registry.get(source).location_fields,
      )
  except ConfigError as e:
    return str(e)
  return None


def verify(
  where: str,
  saved: dict[str, Any],
  restored: Any,
  with_memory: bool,
  identity: Optional[dict[str, Any]],
  accept: tuple[str, ...],
  advice: str,
) -> None:
  """DamagedCheckpointError if what was read from checkpoint `where` differs
  from its integrity record `saved` (a field missing, checksums, non-finite
  values, the data position); RunMismatchError if it was saved by another
  run than `identity` (parts named in `accept` only warn). `advice`: what
  the error suggests."""
  check_record(where, saved, advice)
  got = fingerprint(
    {"state": restored["state"], "memory": restored.get("memory") or {}}
    if with_memory
    else {"state": restored["state"]}
  )
  bad = [name for name, sums in got["sums"].items() if saved.get("sums", {}).get(name) != sums]
  if bad:
    raise DamagedCheckpointError(
      f"checkpoint {where} is damaged: {len(bad)} array(s) differ from the checksums "
      f"saved with them ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
      f"{advice}"
    )
  if got["nonfinite"]:
    raise DamagedCheckpointError(
      f"checkpoint {where} holds non-finite values ({', '.join(got['nonfinite'][:3])}); {advice}"
    )
  if json_digest(restored["data"]) != saved["data_sha256"]:
    raise DamagedCheckpointError(
      f"checkpoint {where} is damaged: its data position (data/) differs from the digest "
      f"saved with it; {advice}"
    )
  compare_identity(f"checkpoint {where}", saved.get("identity"), identity, accept)


def path_name(path: jax.tree_util.KeyPath) -> str:
  """A pytree path as "a/b/c"."""
  parts = []
  for k in path:
    for attr in ("name", "key", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _bits(x: jax.Array) -> jax.Array:
  """The array's bits as uint32 words (bool and 1-2 byte types widened)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = jnp.dtype(x.dtype).itemsize
  if size == 4:
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  if size in (1, 2):
    narrow = jnp.uint8 if size == 1 else jnp.uint16
    return jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8 bytes: [..., 2] words


@jax.jit
def _fingerprints(leaves: list[jax.Array]) -> tuple[list[jax.Array], list[jax.Array]]:
  sums, finite = [], []
  for x in leaves:
    words = _bits(x).reshape(-1)
    weights = jnp.arange(words.shape[0], dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
    sums.append(jnp.stack([words.sum(dtype=jnp.uint32), (words * weights).sum(dtype=jnp.uint32)]))
    finite.append(
      jnp.isfinite(x).all() if jnp.issubdtype(x.dtype, jnp.floating) else jnp.bool_(True)
    )
  return sums, finite


def fingerprint(tree: Any) -> dict[str, Any]:
  """{"sums": {array name: [sum, weighted sum]}, "nonfinite": [names]}.

  Computed where the arrays live (one small jitted reduction per array), so
  it costs no host transfer of the arrays and works on any mesh and any
  number of processes: the sums come back replicated.
  """
  named = [
    (path_name(p), x) for p, x in jax.tree_util.tree_leaves_with_path(tree) if np.prod(x.shape) > 0
  ]
  if not named:
    return {"sums": {}, "nonfinite": []}
  sums, finite = _fingerprints([x for _, x in named])
  sums = [np.asarray(s).tolist() for s in sums]
  return {
    "sums": {name: s for (name, _), s in zip(named, sums)},
    "nonfinite": [name for (name, _), ok in zip(named, finite) if not bool(ok)],
  }
