"""Nothing lost, fourth pass: every reader verifies what it reads, workdir or
export alike. The run's identity (the model config, the tokenizer, the data
config's generating fields) travels into exports and is compared by every
reader; a field missing from an integrity record is damage; the data
identity covers every source; a saved config never imports a module or
makes a reader download; and a broken export or a wrong path is one line.

The runs here are untrained (helpers.untrained_workdir): a checkpoint as
training leaves it, in seconds, with nothing compiled."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import compressive
from compressive import data as data_lib
from compressive import plugins
from compressive.data import registry
from compressive.errors import CheckpointError, ConfigError, DataError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import export as export_lib
from compressive.training import loop as train_lib
from helpers import (ROOT, generated_texts, sentencepiece_run_fields, tiny_experiment,
                     untrained_workdir)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return untrained_workdir(tmp_path_factory.mktemp("run") / "wd")


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("exported") / "out")
  export_lib.export(run, out)
  return out


def copy(path, tmp_path, name="copy"):
  target = tmp_path / name
  shutil.copytree(path, target)
  return target


def edit_json(path, edit):
  value = json.loads(open(path).read())
  edit(value)
  with open(path, "w") as f:
    json.dump(value, f)


def reseal(export):
  """Writes the digests of an export's config.json and export.json again, as
  someone crafting an export would."""
  def fix(manifest):
    manifest["config_sha256"] = export_lib._file_digest(os.path.join(export, "config.json"))
    manifest["sha256"] = export_lib._manifest_digest(manifest)
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
  export_lib.export(workdir, out)
  return workdir, out, model


def test_an_export_refuses_a_tokenizer_retrained_in_place(spm_run, tmp_path):
  workdir, out, model = spm_run
  compressive.load(out)
  original = model.read_bytes()
  try:
    # Retrained in place on other texts: the same vocabulary size, other pieces.
    data_lib.train_sentencepiece(generated_texts(30, seed=1), 320, str(model))
    for path in (workdir, out):
      with pytest.raises(ckpt_lib.RunMismatchError, match="^the tokenizer differs"):
        compressive.load(path)
      # The tools compare it before any corpus is read or model built.
      with pytest.raises(ckpt_lib.RunMismatchError, match="^the tokenizer differs"):
        export_lib.check_identity(path, ckpt_lib.load_config(path))
  finally:
    model.write_bytes(original)


@pytest.mark.slow
def test_every_reader_tool_refuses_an_export_after_a_retrained_tokenizer(spm_run, tmp_path):
  _, out, model = spm_run
  original = model.read_bytes()
  try:
    data_lib.train_sentencepiece(generated_texts(30, seed=1), 320, str(model))
    for tool, extra in (("eval.py", ["--max_segments=1"]), ("sample.py", ["--prompt=the king"]),
                        ("analyze.py", ["--max_segments=1"])):
      r = subprocess.run([sys.executable, tool, f"--workdir={out}", *extra], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
      lines = r.stderr.strip().splitlines()
      assert r.returncode == 2 and "Traceback" not in r.stderr, (tool, r.stderr[-3000:])
      assert lines[-1].startswith(f"error: the tokenizer differs from the one export {out}"), (
          tool, lines[-1])
  finally:
    model.write_bytes(original)


# -- A missing field in an integrity record is damage. ----------------------------


@pytest.mark.parametrize("field", ["data_sha256", "identity", "version", "sums"])
def test_a_field_removed_from_an_integrity_record_is_damage(run, tmp_path, field):
  workdir = copy(run, tmp_path)
  edit_json(workdir / "checkpoints" / "1" / "integrity" / "metadata",
            lambda record: record.pop(field))
  with pytest.raises(ckpt_lib.DamagedCheckpointError, match="integrity record lacks"):
    compressive.load(str(workdir))


def test_an_identity_part_removed_is_damage_and_a_newer_record_is_named(run, tmp_path):
  workdir = copy(run, tmp_path)
  record = workdir / "checkpoints" / "1" / "integrity" / "metadata"
  edit_json(record, lambda r: r["identity"].pop("data"))
  with pytest.raises(ckpt_lib.DamagedCheckpointError, match="lacks identity.data"):
    compressive.load(str(workdir))
  edit_json(record, lambda r: r.update(version=99))
  with pytest.raises(CheckpointError, match="newer version of compressive"):
    compressive.load(str(workdir))


@pytest.mark.parametrize("field", ["identity", "sha256", "config_sha256"])
def test_a_field_removed_from_an_export_is_damage(exported, tmp_path, field):
  out = copy(exported, tmp_path)
  edit_json(out / "export.json", lambda m: m.pop(field))
  with pytest.raises(CheckpointError, match=f"export.json is damaged: it lacks {field}"):
    compressive.load(str(out))


# -- The data identity covers every source. ---------------------------------------


@pytest.mark.parametrize("overrides,changed,expected", [
    ({}, {"data.synthetic.seed": 1}, "data.synthetic.seed 0 -> 1"),
    ({}, {"data.synthetic.num_docs": (17, 4, 4)}, "data.synthetic.num_docs [16, 4, 4] -> [17, 4, 4]"),
    ({"data.source": "recall", "data.recall.num_docs": (8, 2, 2)}, {"data.recall.facts": 4},
     "data.recall.facts 8 -> 4"),
], ids=["synthetic seed", "synthetic num_docs", "recall facts"])
def test_a_changed_data_section_does_not_resume(tmp_path, overrides, changed, expected):
  workdir = untrained_workdir(tmp_path / "wd", tiny_experiment(**overrides))
  expected = re.escape(expected)
  with pytest.raises(ckpt_lib.RunMismatchError, match=f"^the data config differs.*{expected}"):
    train_lib.train_and_evaluate(tiny_experiment(**overrides, **changed), workdir)
  # Readers refuse a config.json whose data section was edited the same way.
  section, field = list(changed)[0].split(".")[1:]
  value = list(changed.values())[0]
  edit_json(os.path.join(workdir, "config.json"),
            lambda c: c["data"][section].update({field: value}))
  with pytest.raises(ckpt_lib.RunMismatchError, match=f"^the data config differs.*{expected}"):
    compressive.load(workdir)


def test_the_data_identity_leaves_out_only_where_the_data_is(tmp_path):
  c = tiny_experiment(**{"data.source": "text_files", "data.text_files.path": "/a"}).data
  moved = tiny_experiment(**{"data.source": "text_files", "data.text_files.path": "/b"}).data
  assert data_lib.data_identity(c) == data_lib.data_identity(moved)
  assert data_lib.data_identity(c)["text_files"] == {"heldout_fraction": 0.05,
                                                     "text_errors": "strict"}
  books = tiny_experiment(**{"data.source": "books", "data.books.cache_dir": "/x"}).data
  assert data_lib.data_identity(books) == {"source": "books", "books": {"heldout_fraction": 0.05}}


@pytest.fixture
def toy_source():
  """A plugin data source with a location field and a content hook."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def default_config():
    c = ml_collections.ConfigDict()
    c.folder, c.length = "", 5
    return c

  def get_documents(data_config, split, tokenizer):
    del split, tokenizer
    return data_lib.TokenDocuments([np.arange(data_config.toy_id.length, dtype=np.int32)],
                                   description="toy_id")

  source = registry.register(registry.Source(
      name="toy_id", default_config=default_config, get_documents=get_documents,
      identity=lambda c: f"toy_id content {c.toy_id.length}", location_fields=("folder",)))
  yield source
  registry.unregister("toy_id")


def test_a_plugin_source_is_identified_by_its_fields_and_its_hook(toy_source):
  c = data_lib.default_data_config()
  with c.unlocked():
    c.source = "toy_id"
  assert data_lib.data_identity(c) == {"source": "toy_id", "toy_id": {"length": 5}}
  assert data_lib.corpus_identity(c) == "toy_id content 5"
  saved = ckpt_lib.run_identity(tiny_experiment(), "bytes", data_lib.corpus_identity(c),
                                data_lib.data_identity(c))
  c.toy_id.folder = "/elsewhere"  # moved: the same data
  same = ckpt_lib.run_identity(tiny_experiment(), "bytes", data_lib.corpus_identity(c),
                               data_lib.data_identity(c))
  ckpt_lib.compare_identity("checkpoint x", saved, same, ())
  c.toy_id.length = 6
  other = ckpt_lib.run_identity(tiny_experiment(), "bytes", data_lib.corpus_identity(c),
                                data_lib.data_identity(c))
  with pytest.raises(ckpt_lib.RunMismatchError, match="data.toy_id.length 5 -> 6"):
    ckpt_lib.compare_identity("checkpoint x", saved, other, ())
  ckpt_lib.compare_identity("checkpoint x", saved, other, ("corpus", "data"))  # accepted


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
def test_a_saved_config_never_imports_the_module_it_names(run, exported, tmp_path, crafted_module,
                                                          section, field):
  workdir = copy(run, tmp_path, "wd")
  out = copy(exported, tmp_path, "out")
  for path in (workdir, out):
    edit_json(path / "config.json", lambda c: c[section].update({field: "h31_crafted_mod:X"}))
  reseal(str(out))
  with pytest.raises(ConfigError, match=r"module 'h31_crafted_mod' is not imported.*"
                                        r"--plugin=h31_crafted_mod"):
    compressive.load(str(workdir))
  # The export's identity names the model config that differs, or the name
  # is refused as above: either way, before anything is imported.
  with pytest.raises((ConfigError, ckpt_lib.RunMismatchError), match="h31_crafted_mod"):
    compressive.load(str(out))
  assert not crafted_module.exists()
  # Named by the user, it is imported (and the config is then checked as usual).
  with pytest.raises(ConfigError):
    compressive.load(str(workdir), plugins=["h31_crafted_mod"])
  assert crafted_module.exists()


def test_a_reader_never_downloads(tmp_path):
  from compressive.data import books  # pylint: disable=g-import-not-at-top
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
  edit_json(os.path.join(workdir, "config.json"),
            lambda c: c["data"]["books"].update(cache_dir=str(chosen)))
  r = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--max_segments=1"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert "never downloads" in r.stderr.strip().splitlines()[-1]
  assert not chosen.exists()
  edit_json(os.path.join(workdir, "config.json"),
            lambda c: c["data"]["books"].update(heldout_fraction=0.2))
  r = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--max_segments=1"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1].startswith(
      "error: the data config differs"), r.stderr[-3000:]
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


@pytest.mark.parametrize("damage,message", [
    (_no_params, r"export .* is damaged: its params/ folder is missing"),
    (_empty_params, r"export .* is damaged"),
    (_truncated_params, r"export .* is damaged"),
    (lambda out: os.remove(out / "config.json"), r"export .* is damaged: its config.json is missing"),
    (lambda out: (out / "config.json").write_text('{"model": {'), r"config.json was changed since"),
    (lambda out: (out / "export.json").write_text('{"format": "compressive-pa'), r"export.json is damaged"),
], ids=["no params", "params emptied", "params truncated", "no config.json",
        "config.json truncated", "export.json truncated"])
def test_a_broken_export_is_one_line(exported, tmp_path, damage, message):
  out = copy(exported, tmp_path)
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
  with pytest.raises(FileNotFoundError, match=r"config.json not found: .* is not a training workdir"):
    compressive.load(str(empty))
