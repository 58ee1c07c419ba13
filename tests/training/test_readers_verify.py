"""Every reader verifies what it reads, workdir or export alike. The run's
identity (the model config, the tokenizer, the data config's generating
fields) travels into exports and is compared by every
reader; a field missing from an integrity record is damage; the data
identity covers every source; a saved config never imports a module or
makes a reader download; and a broken export or a wrong path is one line.

The runs here are untrained (helpers.untrained_workdir): a checkpoint as
training leaves it, in seconds, with nothing compiled."""

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import sys

import pytest

import compressive
from compressive import cli, plugins
from compressive import data as data_lib
from compressive.data import registry, tokenizers
from compressive.errors import CheckpointError, ConfigError, DataError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import export as export_lib
from compressive.training import exporting, integrity, runconfig
from compressive.training import loop as train_lib
from helpers import (
  checked,
  copy_tree,
  data_of,
  edit_json,
  generated_texts,
  run_identity_of,
  sentencepiece_run_fields,
  tiny_experiment,
  to_train,
  untrained_workdir,
)
import inprocess


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return untrained_workdir(tmp_path_factory.mktemp("run") / "wd")


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("exported") / "out")
  exporting.export(run, out)
  return out


def reseal(export):
  """Writes the digests of an export's config.json and export.json again, as
  someone crafting an export would."""

  def fix(manifest):
    manifest["config_sha256"] = export_lib.file_digest(os.path.join(export, "config.json"))
    manifest["sha256"] = export_lib.manifest_digest(manifest)

  edit_json(os.path.join(export, "export.json"), fix)


# -- The tokenizer's identity travels into exports. -------------------------------


@pytest.fixture(scope="module")
def spm_run(tmp_path_factory):
  """(workdir, its export, the SentencePiece model's path) of a run on a
  SentencePiece tokenizer."""
  tmp = tmp_path_factory.mktemp("spm")
  fields = sentencepiece_run_fields(tmp)
  model = tmp / "m.model"
  config = tiny_experiment(**fields)
  workdir = untrained_workdir(tmp / "wd", config)
  out = str(tmp / "out")
  exporting.export(workdir, out)
  return workdir, out, model


def test_an_export_refuses_a_tokenizer_retrained_in_place(spm_run, tmp_path):
  workdir, out, model = spm_run
  compressive.load(out)
  original = model.read_bytes()
  try:
    # Retrained in place on other texts: the same vocabulary size, other pieces.
    data_lib.train_sentencepiece(generated_texts(30, seed=1), 320, str(model))
    for path in (workdir, out):
      with pytest.raises(integrity.RunMismatchError, match="^the tokenizer differs"):
        compressive.load(path)
      # The tools compare it before any corpus is read or model built.
      with pytest.raises(integrity.RunMismatchError, match="^the tokenizer differs"):
        export_lib.check_identity(path, checked(runconfig.load_config(path)))
  finally:
    model.write_bytes(original)


@pytest.mark.slow
def test_every_reader_tool_refuses_an_export_after_a_retrained_tokenizer(spm_run, tmp_path):
  _, out, model = spm_run
  original = model.read_bytes()
  try:
    data_lib.train_sentencepiece(generated_texts(30, seed=1), 320, str(model))
    for tool, extra in (
      ("eval.py", ["--max_segments=1"]),
      ("sample.py", ["--prompt=the king"]),
      ("analyze.py", ["--max_segments=1"]),
    ):
      r = inprocess.run(tool, [f"--workdir={out}", *extra])
      lines = r.stderr.strip().splitlines()
      assert r.returncode == 2 and "Traceback" not in r.stderr, (tool, r.stderr[-3000:])
      assert lines[-1].startswith(f"error: the tokenizer differs from the one export {out}"), (
        tool,
        lines[-1],
      )
  finally:
    model.write_bytes(original)


# -- A missing field in an integrity record is damage. ----------------------------


@pytest.mark.parametrize("field", ["data_sha256", "identity", "sums"])
def test_a_field_removed_from_an_integrity_record_is_damage(run, tmp_path, field):
  workdir = copy_tree(run, tmp_path)
  edit_json(
    workdir / "checkpoints" / "1" / "integrity" / "metadata", lambda record: record.pop(field)
  )
  with pytest.raises(integrity.DamagedCheckpointError, match="integrity record lacks"):
    compressive.load(str(workdir))


def test_an_identity_part_removed_is_damage_and_a_newer_record_is_named(run, tmp_path):
  workdir = copy_tree(run, tmp_path)
  record = workdir / "checkpoints" / "1" / "integrity" / "metadata"
  edit_json(record, lambda r: r["identity"].pop("data"))
  with pytest.raises(integrity.DamagedCheckpointError, match="lacks identity.data"):
    compressive.load(str(workdir))
  edit_json(record, lambda r: r.update(version=99))
  with pytest.raises(CheckpointError, match="newer version of compressive"):
    compressive.load(str(workdir))


@pytest.mark.parametrize("field", ["identity", "sha256", "config_sha256"])
def test_a_field_removed_from_an_export_is_damage(exported, tmp_path, field):
  out = copy_tree(exported, tmp_path)
  edit_json(out / "export.json", lambda m: m.pop(field))
  with pytest.raises(CheckpointError, match=f"export.json is damaged: it lacks {field}"):
    compressive.load(str(out))


# -- The data identity covers every source. ---------------------------------------


@pytest.mark.parametrize(
  "overrides,changed,expected",
  [
    ({}, {"data.synthetic.seed": 1}, "data.synthetic.seed 0 -> 1"),
    (
      {},
      {"data.synthetic.num_docs": (17, 4, 4)},
      "data.synthetic.num_docs [16, 4, 4] -> [17, 4, 4]",
    ),
    (
      {"data.source": "recall", "data.recall.num_docs": (8, 2, 2)},
      {"data.recall.facts": 4},
      "data.recall.facts 8 -> 4",
    ),
  ],
  ids=["synthetic seed", "synthetic num_docs", "recall facts"],
)
def test_a_changed_data_section_does_not_resume(tmp_path, overrides, changed, expected):
  workdir = untrained_workdir(tmp_path / "wd", tiny_experiment(**overrides))
  expected = re.escape(expected)
  with pytest.raises(integrity.RunMismatchError, match=f"^the data config differs.*{expected}"):
    train_lib.train_and_evaluate(to_train(tiny_experiment(**overrides, **changed)), workdir)
  # Readers refuse a config.json whose data section was edited the same way.
  section, field = list(changed)[0].split(".")[1:]
  value = list(changed.values())[0]
  edit_json(
    os.path.join(workdir, "config.json"), lambda c: c["data"][section].update({field: value})
  )
  with pytest.raises(integrity.RunMismatchError, match=f"^the data config differs.*{expected}"):
    compressive.load(workdir)


def test_the_data_identity_leaves_out_only_where_the_data_is(tmp_path):
  c = tiny_experiment(**{"data.source": "text_files", "data.text_files.path": "/a"}).data
  moved = tiny_experiment(**{"data.source": "text_files", "data.text_files.path": "/b"}).data
  assert data_lib.data_identity(data_of(c)) == data_lib.data_identity(data_of(moved))
  assert data_lib.data_identity(data_of(c))["text_files"] == {
    "heldout_fraction": 0.05,
    "text_errors": "strict",
    "document_bytes": 16384,
  }
  books = tiny_experiment(**{"data.source": "books", "data.books.cache_dir": "/x"}).data
  assert data_lib.data_identity(data_of(books)) == {
    "source": "books",
    "books": {"heldout_fraction": 0.05},
  }


@pytest.fixture
def toy_source():
  """A plugin data source with a location field and a content hook."""
  import numpy as np

  @dataclasses.dataclass(frozen=True)
  class ToyId:
    folder: str = ""
    length: int = 5

  def get_documents(data_config, split, tokenizer):
    del split, tokenizer
    return data_lib.TokenDocuments(
      [np.arange(data_config.toy_id.length, dtype=np.int32)], description="toy_id"
    )

  source = registry.register(
    registry.Source(
      name="toy_id",
      schema=ToyId,
      get_documents=get_documents,
      identity=lambda c: f"toy_id content {c.toy_id.length}",
      location_fields=("folder",),
    )
  )
  yield source
  registry.unregister("toy_id")


def test_a_plugin_source_is_identified_by_its_fields_and_its_hook(toy_source):
  c = data_lib.default_data_config()
  with c.unlocked():
    c.source = "toy_id"
  assert data_lib.data_identity(data_of(c)) == {"source": "toy_id", "toy_id": {"length": 5}}
  assert data_lib.corpus_identity(data_of(c)) == "toy_id content 5"
  saved = integrity.run_identity(
    checked(tiny_experiment()).model,
    "bytes",
    data_lib.corpus_identity(data_of(c)),
    data_lib.data_identity(data_of(c)),
  )
  c.toy_id.folder = "/elsewhere"  # moved: the same data
  same = integrity.run_identity(
    checked(tiny_experiment()).model,
    "bytes",
    data_lib.corpus_identity(data_of(c)),
    data_lib.data_identity(data_of(c)),
  )
  integrity.compare_identity("checkpoint x", saved, same, ())
  c.toy_id.length = 6
  other = integrity.run_identity(
    checked(tiny_experiment()).model,
    "bytes",
    data_lib.corpus_identity(data_of(c)),
    data_lib.data_identity(data_of(c)),
  )
  with pytest.raises(integrity.RunMismatchError, match="data.toy_id.length 5 -> 6"):
    integrity.compare_identity("checkpoint x", saved, other, ())
  integrity.compare_identity("checkpoint x", saved, other, ("corpus", "data"))  # accepted


# -- A saved config never imports code or makes a reader download. ----------------


PLUGIN = """
import os
open(os.path.join(os.path.dirname(__file__), "imported"), "w").close()
"""


@pytest.fixture
def crafted_module(tmp_path, monkeypatch):
  """A module whose import leaves a file `imported` beside it."""
  folder = tmp_path / "mods"
  folder.mkdir()
  (folder / "h31_crafted_mod.py").write_text(PLUGIN)
  monkeypatch.syspath_prepend(str(folder))
  monkeypatch.delitem(sys.modules, "h31_crafted_mod", raising=False)
  return folder / "imported"


@pytest.mark.parametrize("section,field", [("model", "compression"), ("data", "source")])
def test_a_saved_config_never_imports_the_module_it_names(
  run, exported, tmp_path, crafted_module, section, field
):
  workdir = copy_tree(run, tmp_path, "wd")
  out = copy_tree(exported, tmp_path, "out")
  for path in (workdir, out):
    edit_json(path / "config.json", lambda c: c[section].update({field: "h31_crafted_mod:X"}))
  reseal(str(out))
  with pytest.raises(
    ConfigError,
    match=r"module 'h31_crafted_mod' is not imported.*"
    r"--plugin=h31_crafted_mod",
  ):
    compressive.load(str(workdir))
  # The export's identity names the model config that differs, or the name
  # is refused as above: either way, before anything is imported.
  with pytest.raises((ConfigError, integrity.RunMismatchError), match="h31_crafted_mod"):
    compressive.load(str(out))
  assert not crafted_module.exists()
  # Named by the user, it is imported (and the config is then checked as usual).
  with pytest.raises(ConfigError):
    compressive.load(str(workdir), plugins=["h31_crafted_mod"])
  assert crafted_module.exists()


def test_a_reader_never_downloads(tmp_path):
  from compressive.data import books

  cache = tmp_path / "chosen"
  calls = []
  with plugins.saved_config():
    with pytest.raises(DataError, match="never downloads"):
      books.fetch(books.ARCHIVES[0], str(cache), download=calls.append)
  assert not calls and not cache.exists()


@pytest.mark.slow
def test_eval_of_an_edited_data_section_reads_and_writes_nothing(tmp_path):
  # An untrained run on books; its config.json then points the cache at a
  # folder of the editor's choosing (a location: the identity allows it),
  # and elsewhere changes what would be evaluated (refused by name).
  workdir = untrained_workdir(tmp_path / "wd", tiny_experiment(**{"data.source": "books"}))
  chosen = tmp_path / "chosen"
  edit_json(
    os.path.join(workdir, "config.json"), lambda c: c["data"]["books"].update(cache_dir=str(chosen))
  )
  r = inprocess.run("eval.py", [f"--workdir={workdir}", "--max_segments=1"])
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert "never downloads" in r.stderr.strip().splitlines()[-1]
  assert not chosen.exists()
  edit_json(
    os.path.join(workdir, "config.json"), lambda c: c["data"]["books"].update(heldout_fraction=0.2)
  )
  r = inprocess.run("eval.py", [f"--workdir={workdir}", "--max_segments=1"])
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1].startswith("error: the data config differs"), r.stderr[
    -3000:
  ]
  assert not chosen.exists()


# -- A broken export or a wrong path is one line. ---------------------------------


def _no_params(out):
  shutil.rmtree(out / "params")


def _empty_params(out):
  for root, _, files in os.walk(out / "params"):
    for name in files:
      os.remove(os.path.join(root, name))


def _truncated_params(out):
  for root, _, files in os.walk(out / "params"):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize(
  "damage,message",
  [
    (_no_params, r"export .* is damaged: its params/ folder is missing"),
    (_empty_params, r"export .* is damaged"),
    (_truncated_params, r"export .* is damaged"),
    (
      lambda out: os.remove(out / "config.json"),
      r"export .* is damaged: its config.json is missing",
    ),
    (lambda out: (out / "config.json").write_text('{"model": {'), r"config.json was changed since"),
    (
      lambda out: (out / "export.json").write_text('{"format": "compressive-pa'),
      r"export.json is damaged",
    ),
  ],
  ids=[
    "no params",
    "params emptied",
    "params truncated",
    "no config.json",
    "config.json truncated",
    "export.json truncated",
  ],
)
def test_a_broken_export_is_one_line(exported, tmp_path, damage, message):
  out = copy_tree(exported, tmp_path)
  damage(out)
  with pytest.raises(CheckpointError, match=message) as info:
    compressive.load(str(out))
  assert "\n" not in str(info.value)


def test_a_path_that_is_no_run_is_named(run, tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(FileNotFoundError, match=r"file is a file, not a folder") as info:
    compressive.load(str(tmp_path / "file"))
  assert "config.json/config.json" not in str(info.value)
  with pytest.raises(FileNotFoundError, match=r"config.json is a file, not a folder"):
    compressive.load(os.path.join(run, "config.json"))
  with pytest.raises(FileNotFoundError, match=r"nowhere does not exist"):
    compressive.load(str(tmp_path / "nowhere"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(
    FileNotFoundError, match=r"config.json not found: .* is not a training workdir"
  ):
    compressive.load(str(empty))


# -- Any failure to parse is damage, and a null never turns a check off. ---------


DEEP = "[" * 100_000 + "]" * 100_000  # past Python's recursion: RecursionError
BIG_INT = "9" * 4301  # past Python's int-string limit: ValueError


def damaged_config_text(values, kind):
  text = json.dumps(values)
  return {
    "nested 100,000 deep": DEEP,
    "an int of 4,301 digits": text[:-1] + f', "seed_": {BIG_INT}}}',
    "a key with a dot": json.dumps({**values, "model.num_layers": 2}),
    "a field 900 deep": text[:-1] + ', "extra": ' + "[" * 900 + "]" * 900 + "}",
    "a UTF-8 BOM": "\ufeff" + text,
    "a list": json.dumps([values]),
  }[kind]


CONFIG_DAMAGE = [
  "nested 100,000 deep",
  "an int of 4,301 digits",
  "a key with a dot",
  "a field 900 deep",
  "a UTF-8 BOM",
  "a list",
]


def tool_line(run):
  """(exit code, stderr) of `run()` inside cli.user_errors, as a tool runs it."""
  err = io.StringIO()
  with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
    with cli.user_errors():
      run()
      raise AssertionError("accepted")
  return info.value.code, err.getvalue()


def assert_one_line(run, *expected):
  code, err = tool_line(run)
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
  assert all(e in lines[0] for e in expected), lines[0]


@pytest.mark.parametrize("kind", CONFIG_DAMAGE)
def test_a_config_json_that_cannot_be_parsed_is_one_line_for_every_reader(
  run, exported, tmp_path, kind
):
  for source in (run, exported):
    target = copy_tree(source, tmp_path, f"copy{source == exported}")
    path = target / "config.json"
    path.write_text(damaged_config_text(json.loads(path.read_text()), kind))
    if source == exported:
      reseal(str(target))  # else its digest names the edit first
    # compressive.load, and what eval.py, sample.py, analyze.py read first.
    assert_one_line(lambda t=str(target): compressive.load(t), f"{path} is damaged (")
    assert_one_line(lambda t=str(target): runconfig.load_config(t), f"{path} is damaged (")


RECORD = os.path.join("checkpoints", "1", "integrity", "metadata")


@pytest.mark.parametrize(
  "text,cause",
  [
    (DEEP, "nests brackets"),
    ('{"version": 2, "sums": ' + BIG_INT + "}", "4300"),
    ("\ufeff{}", "BOM"),
    ("[]", "holds a list"),
  ],
)
def test_an_integrity_record_that_cannot_be_parsed_is_damage(
  run, tmp_path, monkeypatch, text, cause
):
  monkeypatch.setattr(ckpt_lib, "READ_RETRY_DELAYS", (0.0,))
  workdir = copy_tree(run, tmp_path)
  (workdir / RECORD).write_text(text)
  assert_one_line(lambda: compressive.load(str(workdir)), "checkpoints/1 is damaged", cause)


@pytest.mark.parametrize(
  "text,cause",
  [
    (DEEP, "nests brackets"),
    ('{"format": "compressive-params", "step": ' + BIG_INT + "}", "4300"),
    ("\ufeff{}", "BOM"),
    ('["compressive-params"]', "list"),
  ],
)
def test_an_export_json_that_cannot_be_parsed_is_one_line(exported, tmp_path, text, cause):
  out = copy_tree(exported, tmp_path)
  (out / "export.json").write_text(text)
  assert_one_line(lambda: compressive.load(str(out)), "export.json is damaged (", cause)


def seed_changed(path):
  edit_json(os.path.join(path, "config.json"), lambda c: c["data"]["synthetic"].update(seed=1))


def restore_as_trainer(workdir, config):
  """What a resume does with `workdir`'s checkpoint 1: restore it as `config`'s run."""
  from compressive import config as config_lib
  from compressive.training import setup as setup_lib

  setup = setup_lib.build_setup(config_lib.check(config))
  checkpointer = ckpt_lib.Checkpointer(str(workdir))
  try:
    checkpointer.restore(1, *setup.restore_targets(), identity=run_identity_of(config))
  finally:
    checkpointer.close()


def test_a_null_identity_is_damage_not_another_corpus(run, tmp_path):
  workdir = copy_tree(run, tmp_path)
  edit_json(workdir / RECORD, lambda r: r.update(identity=None))
  seed_changed(workdir)
  for read in (
    lambda: compressive.load(str(workdir)),  # the tools compare before any corpus:
    lambda: export_lib.check_identity(str(workdir), runconfig.load_config(str(workdir))),
    lambda: restore_as_trainer(workdir, tiny_experiment(**{"data.synthetic.seed": 1})),
  ):
    with pytest.raises(integrity.DamagedCheckpointError, match="record holds identity null"):
      read()
  assert_one_line(lambda: compressive.load(str(workdir)), "identity null")


@pytest.mark.parametrize(
  "edit,named",
  [
    (lambda r: r["identity"].update(data=None), "identity.data null"),
    (lambda r: r["identity"].update(tokenizer=None), "identity.tokenizer null"),
    (lambda r: r["identity"].update(model=None), "identity.model null"),
    (lambda r: r.update(data_sha256=None), "data_sha256 null"),
    (lambda r: r.update(nonfinite=None), "nonfinite null"),
  ],
  ids=["identity.data", "identity.tokenizer", "identity.model", "data_sha256", "nonfinite"],
)
def test_a_null_in_an_integrity_record_is_damage(run, tmp_path, edit, named):
  workdir = copy_tree(run, tmp_path)
  edit_json(workdir / RECORD, edit)
  seed_changed(workdir)
  with pytest.raises(integrity.DamagedCheckpointError, match=re.escape(named)):
    export_lib.check_identity(str(workdir), runconfig.load_config(str(workdir)))
  with pytest.raises(integrity.DamagedCheckpointError, match=re.escape(named)):
    restore_as_trainer(workdir, tiny_experiment(**{"data.synthetic.seed": 1}))


def test_a_null_corpus_digest_differs_from_a_measured_one(tmp_path):
  folder = tmp_path / "texts"
  folder.mkdir()
  for i, text in enumerate(generated_texts(40)):
    (folder / f"{i}.txt").write_text(text)
  config = tiny_experiment(**{"data.source": "text_files", "data.text_files.path": str(folder)})
  workdir = untrained_workdir(tmp_path / "wd", config)
  edit_json(os.path.join(workdir, RECORD), lambda r: r["identity"].update(corpus=None))
  with pytest.raises(integrity.RunMismatchError, match="training corpus differs .*none recorded"):
    restore_as_trainer(workdir, config)


def test_an_export_with_its_checks_nulled_is_damage_not_another_corpus(exported, tmp_path):
  out = copy_tree(exported, tmp_path)
  seed_changed(out)

  def nulls(manifest):
    manifest.update(sha256=None, config_sha256=None)
    manifest["identity"]["data"] = None

  edit_json(out / "export.json", nulls)
  for read in (
    lambda: compressive.load(str(out)),
    lambda: export_lib.check_identity(str(out), runconfig.load_config(str(out))),
  ):
    with pytest.raises(
      CheckpointError,
      match=re.escape(
        "export.json is damaged: it holds identity.data null, config_sha256 null, sha256 null"
      ),
    ):
      read()
  assert_one_line(lambda: compressive.load(str(out)), "identity.data null")


def test_an_export_rewritten_as_version_1_is_not_read(exported, tmp_path):
  out = copy_tree(exported, tmp_path)
  seed_changed(out)

  def downgrade(manifest):
    for field in ("sha256", "config_sha256", "identity"):
      manifest.pop(field)
    manifest["version"] = 1

  edit_json(out / "export.json", downgrade)
  assert_one_line(
    lambda: compressive.load(str(out)), "export format version 1", "export the workdir again"
  )
  edit_json(out / "export.json", lambda m: m.update(version=0))
  assert_one_line(lambda: compressive.load(str(out)), "its version is 0")


@pytest.mark.parametrize(
  "part,edit",
  [
    ("identity.tokenizer", lambda i: i.update(tokenizer=None)),
    ("identity.model", lambda i: i.update(model=None)),
    ("integrity.sums", None),
  ],
)
def test_a_null_check_value_in_a_resealed_export_is_damage(exported, tmp_path, part, edit):
  out = copy_tree(exported, tmp_path)
  if edit is None:
    edit_json(out / "export.json", lambda m: m["integrity"].update(sums=None))
  else:
    edit_json(out / "export.json", lambda m: edit(m["identity"]))
  reseal(str(out))  # as someone crafting an export would: the digests hold
  with pytest.raises(CheckpointError, match=re.escape(f"it holds {part} null")):
    compressive.load(str(out))


# -- What a run or an export holds is read as a regular file, within a bound, --
# -- never through a link it did not write. -----------------------------------------


def _plant(path, kind, tmp_path):
  """Puts `kind` at `path` in place of the file: a link to a 20 GB sparse
  file (read whole, it would fill the machine), a FIFO (an open waits
  forever), a link to /dev/zero (a read never ends) or the sparse file."""
  os.remove(path)
  big = tmp_path / "big"
  with open(big, "wb") as f:
    f.truncate(20 << 30)
  if kind == "a link":
    os.symlink(big, path)
  elif kind == "a FIFO":
    os.mkfifo(path)
  elif kind == "a link to /dev/zero":
    os.symlink("/dev/zero", path)
  else:
    os.rename(big, path)


@pytest.mark.parametrize(
  "kind,cause",
  [
    ("a link", "a link, not a file"),
    ("a FIFO", "a FIFO, not a file"),
    ("a link to /dev/zero", "a link, not a file"),
    ("20 GB", "larger than the 16 MiB read"),
  ],
)
def test_an_export_json_that_is_no_regular_file_within_the_bound_is_one_line(
  exported, tmp_path, kind, cause
):
  out = copy_tree(exported, tmp_path)
  _plant(out / "export.json", kind, tmp_path)
  assert_one_line(lambda: compressive.load(str(out)), "export.json is damaged (", cause)


@pytest.mark.parametrize("kind", ["a link", "a FIFO"])
def test_an_exports_config_json_that_is_no_regular_file_is_one_line(exported, tmp_path, kind):
  out = copy_tree(exported, tmp_path)
  _plant(out / "config.json", kind, tmp_path)
  assert_one_line(lambda: compressive.load(str(out)), "its config.json is missing or not a file")


@pytest.mark.parametrize(
  "kind,cause", [("a link to /dev/zero", "a link, not a file"), ("a FIFO", "a FIFO, not a file")]
)
def test_an_integrity_record_that_is_no_regular_file_is_damage(
  run, tmp_path, monkeypatch, kind, cause
):
  monkeypatch.setattr(ckpt_lib, "READ_RETRY_DELAYS", (0.0,))
  workdir = copy_tree(run, tmp_path)
  _plant(workdir / RECORD, kind, tmp_path)
  assert_one_line(lambda: compressive.load(str(workdir)), "checkpoints/1 is damaged", cause)


@pytest.mark.parametrize(
  "kind,cause",
  [
    ("/dev/zero", "is a device, not a file"),
    ("a FIFO", "is a FIFO, not a file"),
    ("a folder", "is a folder"),
  ],
)
def test_a_tokenizer_file_that_is_no_regular_file_is_one_line(tmp_path, kind, cause):
  # A file the user names is read through a link, but only a regular file.
  path = "/dev/zero" if kind == "/dev/zero" else str(tmp_path / "spm.model")
  if kind == "a FIFO":
    os.mkfifo(path)
  elif kind == "a folder":
    os.mkdir(path)
  with pytest.raises(DataError, match=re.escape(cause)):
    tokenizers.SentencePieceTokenizer(path)


def test_compressive_load_from_python_logs_no_warning_of_orbax(tmp_path, caplog):
  # A reader's checkpoints are read only by design: Orbax's two warnings
  # saying so ("setting save_interval_steps=0", "Given directory is read
  # only") are not the user's news.
  workdir = untrained_workdir(tmp_path / "wd")
  with caplog.at_level("WARNING"):
    compressive.load(workdir)
  assert not [r.getMessage() for r in caplog.records if r.levelno >= 30]
