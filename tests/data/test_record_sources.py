"""Documents from where researchers keep them: JSON lines and Parquet files
(data.source=records) and Hugging Face `datasets` (data.source=hf_datasets),
each with the splits, determinism, resume position and one-line errors of
the other sources, on datasets built here (no network: `datasets` offline,
its cache in the test's folder)."""

import json
import os

import pytest

from compressive import data
from compressive.data import hf_datasets, records
from compressive.errors import ConfigError, DataError
from helpers import (
  assert_stopped_and_resumed_like_straight,
  data_of,
  generated_texts,
  tiny_experiment,
)

TEXTS = generated_texts(30)


def write_jsonl(path, texts, field="text", extra=None):
  with open(path, "w") as f:
    for i, text in enumerate(texts):
      f.write(json.dumps({"id": i, field: text, **(extra or {})}) + "\n")
      if i % 7 == 3:
        f.write("\n")  # blank lines are no records
  return str(path)


def write_parquet(path, texts, field="text", row_group_size=4):
  import pyarrow as pa
  import pyarrow.parquet as pq

  pq.write_table(
    pa.table({"id": list(range(len(texts))), field: texts}),
    str(path),
    row_group_size=row_group_size,
  )
  return str(path)


def config(source, **fields):
  c = data.default_data_config()
  c.source = source
  for k, v in fields.items():
    c[source][k] = v
  return data_of(c)


def documents(c):
  return {s: data.get_documents(c, s, data.ByteTokenizer()) for s in data.SPLITS}


def texts_of(docs):
  return [docs.text(i) for i in range(len(docs))]


# -- JSON lines and Parquet. -------------------------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_one_file_is_a_document_per_record_split_by_hash(tmp_path, kind):
  path = (write_jsonl if kind == "jsonl" else write_parquet)(tmp_path / f"corpus.{kind}", TEXTS)
  c = config("records", path=path)
  data.validate_data_config(c)
  splits = documents(c)
  assert sum(len(d) for d in splits.values()) == len(TEXTS)
  assert min(len(splits["validation"]), len(splits["test"])) >= 1
  # Every record once, as stored, named by file and index.
  got = {d.name(i): d.text(i) for d in splits.values() for i in range(len(d))}
  assert got == {f"corpus.{kind}:{i}": t for i, t in enumerate(TEXTS)}
  # The split is the hash's, the same every time (and the same for either format).
  assert [splits["train"].name(i) for i in range(3)] == [
    documents(c)["train"].name(i) for i in range(3)
  ]
  for s in data.SPLITS:
    assert data.check_documents(c, s, data.ByteTokenizer()) is None
  assert data.corpus_identity(c).startswith(f"records: 1 files, {os.path.getsize(path)} bytes")
  assert data.describe(c) == f"data.source=records ({path})"


def test_a_folder_of_files_named_by_split_keeps_their_splits(tmp_path):
  write_jsonl(tmp_path / "train.jsonl", TEXTS[:20])
  write_parquet(tmp_path / "validation-00000-of-00001.parquet", TEXTS[20:25])
  write_jsonl(tmp_path / "test.jsonl", TEXTS[25:])
  splits = documents(config("records", path=str(tmp_path)))
  assert texts_of(splits["train"]) == TEXTS[:20]
  assert texts_of(splits["validation"]) == TEXTS[20:25]
  assert texts_of(splits["test"]) == TEXTS[25:]
  # Without split names, the files' records are split by hash together.
  other = tmp_path / "pooled"
  other.mkdir()
  write_jsonl(other / "a.jsonl", TEXTS[:15])
  write_parquet(other / "b.parquet", TEXTS[15:])
  pooled = documents(config("records", path=str(other)))
  assert sorted(t for d in pooled.values() for t in texts_of(d)) == sorted(TEXTS)


def test_the_text_field_is_the_configured_one(tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", TEXTS, field="content", extra={"text": 3})
  splits = documents(config("records", path=path, text_field="content"))
  assert sorted(t for d in splits.values() for t in texts_of(d)) == sorted(TEXTS)


@pytest.mark.parametrize(
  "lines,said",
  [
    (
      ['{"text": "a fine first record"}', '{"body": "x"}'],
      "c.jsonl:2 (record 1) has no 'text' field (data.records.text_field); its fields: body",
    ),
    (
      ['{"text": "a fine first record"}', '{"text": 7}'],
      "c.jsonl:2 (record 1): its 'text' is not a string (int)",
    ),
    (
      ['{"text": "a fine first record"}', '["text"]'],
      "c.jsonl:2 (record 1) is a JSON list, not an object with a 'text' field",
    ),
    (['{"text": "a fine first record"}', '{"text": "ok'], "c.jsonl:2 (record 1) is not JSON"),
    (['{"text": "a fine first record"}', '{"text": "x"}'], "has fewer than 2 tokens"),
  ],
)
def test_a_record_that_cannot_be_read_is_one_line_naming_it(tmp_path, lines, said):
  path = tmp_path / "c.jsonl"
  path.write_text("\n".join(lines * 4) + "\n")
  c = config("records", path=str(path))
  with pytest.raises(DataError, match=said.replace("(", r"\(").replace(")", r"\)")) as e:
    for s in data.SPLITS:
      data.check_documents(c, s, data.ByteTokenizer())
  assert "\n" not in str(e.value)


def test_files_that_cannot_be_the_corpus_are_one_line(tmp_path, monkeypatch):
  with pytest.raises(
    ConfigError,
    match="data.records.path='nowhere' is neither a .jsonl or .parquet file nor a folder of them",
  ):
    data.validate_data_config(config("records", path="nowhere"))
  (tmp_path / "notes.txt").write_text("x")
  with pytest.raises(DataError, match="no .jsonl or .parquet files in"):
    documents(config("records", path=str(tmp_path)))
  write_jsonl(tmp_path / "train.jsonl", TEXTS)
  with pytest.raises(DataError, match="names its files by split but has none for validation, test"):
    documents(config("records", path=str(tmp_path)))
  path = write_parquet(tmp_path / "p.parquet", TEXTS, field="body")
  with pytest.raises(
    DataError,
    match=r"p.parquet: no column 'text' \(data.records.text_field\); "
    "its columns: id, body",
  ):
    data.get_documents(config("records", path=path), "train", data.ByteTokenizer())
  (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
  with pytest.raises(DataError, match="bad.parquet: cannot read it as Parquet"):
    data.get_documents(
      config("records", path=str(tmp_path / "bad.parquet")), "train", data.ByteTokenizer()
    )
  import builtins

  real_import = builtins.__import__

  def no_pyarrow(name, *args, **kwargs):
    if name.startswith("pyarrow"):
      raise ImportError(name)
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_pyarrow)
  with pytest.raises(
    DataError,
    match=r"reading Parquet needs pyarrow: pip install "
    r'"compressive\[parquet\]"',
  ):
    records._Parquet(path, "body")


@pytest.mark.slow
def test_a_jsonl_run_resumes_bit_for_bit(tmp_path):
  write_jsonl(tmp_path / "corpus.jsonl", generated_texts(40))
  c = tiny_experiment(
    **{
      "data.source": "records",
      "data.records.path": str(tmp_path / "corpus.jsonl"),
      "eval_every_steps": 0,
    }
  )
  assert assert_stopped_and_resumed_like_straight(c, tmp_path, 6, 8) == list(range(2, 13, 2))


# -- Hugging Face datasets. ----------------------------------------------------------


@pytest.fixture
def hf(tmp_path, monkeypatch):
  """`datasets`, its cache in the test's folder and never online."""
  datasets = pytest.importorskip("datasets")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  hf_datasets._load.cache_clear()
  yield datasets
  hf_datasets._load.cache_clear()


def test_a_saved_dataset_dict_keeps_its_splits(tmp_path, hf):
  saved = str(tmp_path / "saved")
  hf.DatasetDict(
    {
      "train": hf.Dataset.from_dict({"text": TEXTS[:20], "n": list(range(20))}),
      "validation": hf.Dataset.from_dict({"text": TEXTS[20:25], "n": list(range(5))}),
      "test": hf.Dataset.from_dict({"text": TEXTS[25:], "n": list(range(5))}),
    }
  ).save_to_disk(saved)
  c = config("hf_datasets", path=saved)
  data.validate_data_config(c)
  splits = documents(c)
  assert texts_of(splits["train"]) == TEXTS[:20]
  assert texts_of(splits["validation"]) == TEXTS[20:25]
  assert texts_of(splits["test"]) == TEXTS[25:]
  assert splits["test"].name(2) == "test:2"
  for s in data.SPLITS:
    data.check_documents(c, s, data.ByteTokenizer())
  identity = data.corpus_identity(c)
  assert identity.startswith("hf_datasets: test 5 records ") and "train 20 records" in identity
  # Its splits chosen by name: the test split read as validation too.
  c = config("hf_datasets", path=saved, splits=("train", "test", "test"))
  assert texts_of(documents(c)["validation"]) == TEXTS[25:]


def test_a_dataset_of_one_split_is_split_by_hash(tmp_path, hf):
  saved = str(tmp_path / "one")
  hf.Dataset.from_dict({"body": TEXTS}).save_to_disk(saved)
  splits = documents(config("hf_datasets", path=saved, text_column="body"))
  got = {d.name(i): d.text(i) for d in splits.values() for i in range(len(d))}
  assert got == {f"records:{i}": t for i, t in enumerate(TEXTS)}
  assert min(len(splits["validation"]), len(splits["test"])) >= 1


def test_a_dataset_loaded_by_name_from_local_files(tmp_path, hf):
  # load_dataset's name for a local folder of data files (as a Hub name is
  # for a dataset there), read offline into the test's cache.
  folder = tmp_path / "my_corpus"
  folder.mkdir()
  write_jsonl(folder / "train.jsonl", TEXTS[:20])
  write_jsonl(folder / "validation.jsonl", TEXTS[20:25])
  write_jsonl(folder / "test.jsonl", TEXTS[25:])
  splits = documents(config("hf_datasets", path=str(folder)))
  assert texts_of(splits["train"]) == TEXTS[:20]
  assert texts_of(splits["test"]) == TEXTS[25:]


def test_a_dataset_that_cannot_be_read_is_one_line(tmp_path, hf, monkeypatch):
  saved = str(tmp_path / "saved")
  hf.DatasetDict(
    {
      "train": hf.Dataset.from_dict({"text": TEXTS, "n": [1] * 30}),
      "test": hf.Dataset.from_dict({"text": TEXTS[:5], "n": [1] * 5}),
    }
  ).save_to_disk(saved)
  with pytest.raises(
    DataError,
    match=r"has no split 'validation' \(read as validation\); its "
    "splits: train, test; choose three with "
    "data.hf_datasets.splits",
  ):
    documents(config("hf_datasets", path=saved))
  with pytest.raises(
    DataError,
    match=r"has no column 'body' \(data.hf_datasets.text_column\); "
    "its columns: text, n",
  ):
    documents(
      config("hf_datasets", path=saved, text_column="body", splits=("train", "test", "test"))
    )
  with pytest.raises(DataError, match=r"^train:0 \(.*saved\): its 'n' is not a string \(int\)$"):
    for s in data.SPLITS:
      data.check_documents(
        config("hf_datasets", path=saved, text_column="n", splits=("train", "test", "test")),
        s,
        data.ByteTokenizer(),
      )
  with pytest.raises(DataError) as e:
    documents(config("hf_datasets", path="nobody/no_such_dataset"))
  assert str(e.value).startswith(
    "data.hf_datasets.path='nobody/no_such_dataset': cannot load it ("
  ) and "\n" not in str(e.value)
  with pytest.raises(ConfigError, match="data.hf_datasets.splits=.* must be 3 split names"):
    data.validate_data_config(config("hf_datasets", path=saved, splits=("train",)))
  import builtins

  real_import = builtins.__import__
  monkeypatch.setattr(
    builtins,
    "__import__",
    lambda name, *a, **k: (
      (_ for _ in ()).throw(ImportError(name)) if name == "datasets" else real_import(name, *a, **k)
    ),
  )
  hf_datasets._load.cache_clear()
  with pytest.raises(
    DataError,
    match=r"data.source=hf_datasets needs the datasets package: pip "
    r'install "compressive\[datasets\]"',
  ):
    documents(config("hf_datasets", path=saved))


@pytest.mark.slow
def test_a_datasets_run_resumes_bit_for_bit(tmp_path, hf):
  saved = str(tmp_path / "saved")
  hf.Dataset.from_dict({"text": generated_texts(40)}).save_to_disk(saved)
  c = tiny_experiment(
    **{"data.source": "hf_datasets", "data.hf_datasets.path": saved, "eval_every_steps": 0}
  )
  assert assert_stopped_and_resumed_like_straight(c, tmp_path, 6, 8) == list(range(2, 13, 2))
