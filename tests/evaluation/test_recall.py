"""The long-range recall source and its accuracy-by-distance evaluation."""

import numpy as np
import pytest

from compressive import data as data_lib
from compressive.data import recall as recall_source
from compressive.errors import ConfigError
from compressive.evaluation import analysis
from helpers import data_of, make_model, tiny_experiment, to_evaluate


def recall_config():
  c = tiny_experiment()
  c.data.source = "recall"
  c.data.recall.distances = (20, 60)
  c.data.recall.doc_length = 200
  c.data.recall.facts = 3
  c.data.recall.num_docs = (8, 3, 3)
  return c


def test_facts_are_planted_at_the_stated_distances():
  c = recall_config()
  docs = data_lib.get_documents(data_of(c.data), "validation", data_lib.get_tokenizer(c.data))
  for i in range(len(docs)):
    text = docs.text(i)
    assert len(text.encode()) == 200
    assert docs.queries(i), "every document has queries"
    for q in docs.queries(i):
      query_start = q.answer_start - 6
      key, value = (
        text[query_start + 1 : query_start + 5],
        text[q.answer_start : q.answer_start + 4],
      )
      assert text[query_start + 5] == "?"
      fact = text[query_start - q.distance : query_start - q.distance + 11]
      assert fact == f"<{key}={value}>"
      assert q.distance in (20, 60)


def test_an_oracle_free_model_is_scored_on_every_answer():
  c = recall_config()
  docs = data_lib.get_documents(data_of(c.data), "validation", data_lib.get_tokenizer(c.data))
  result = analysis.recall_accuracy(make_model(c.model), docs, to_evaluate(c))
  assert sum(result["queries"]) == sum(len(docs.queries(i)) for i in range(len(docs)))
  assert set(result["distance"]) <= {20, 60}
  assert all(0.0 <= a <= 1.0 for a in result["byte_accuracy"])
  assert np.all(np.asarray(result["exact_match"]) <= np.asarray(result["byte_accuracy"]) + 1e-9)


def test_a_requeried_fact_is_measured_from_its_latest_occurrence():
  c = recall_config()
  c.data.recall.requery_distances = (15, 25)
  docs = data_lib.get_documents(data_of(c.data), "validation", data_lib.get_tokenizer(c.data))
  seconds = 0
  for i in range(len(docs)):
    text = docs.text(i)
    for q in docs.queries(i):
      query_start = q.answer_start - 6
      key, value = (
        text[query_start + 1 : query_start + 5],
        text[q.answer_start : q.answer_start + 4],
      )
      before = text[query_start - q.distance : query_start - q.distance + 11]
      if q.first:
        assert q.distance in (15, 25) and before == f"<{key}={value}>"
      else:
        seconds += 1
        assert q.distance in (20, 60) and before == f"<{key}?{value}>"
      # No other occurrence of the value's key in between: the distance is
      # the reach the answer needs.
      assert f"<{key}" not in text[query_start - q.distance + 1 : query_start]
  assert seconds > 0


@pytest.mark.parametrize("value_len", [1, 2, 7])
def test_a_value_of_any_length_is_planted_and_scored_whole(value_len):
  c = recall_config()
  c.data.recall.value_len = value_len
  docs = data_lib.get_documents(data_of(c.data), "validation", data_lib.get_tokenizer(c.data))
  answers = 0
  for i in range(len(docs)):
    text = docs.text(i)
    for q in docs.queries(i):
      assert q.value_len == value_len
      query_start = q.answer_start - 6
      value = text[q.answer_start : q.answer_start + value_len]
      assert value.isdigit() and text[q.answer_start + value_len] == ">"
      assert text[query_start - q.distance :][: 7 + value_len] == (
        f"<{text[query_start + 1 : query_start + 5]}={value}>"
      )
      answers += 1
  assert answers
  # Scored on exactly value_len bytes per query: a model that predicts every
  # byte right answers every query whole, whatever the length.
  hits = {0: [1] * value_len, 1: [1] * (value_len - 1) + [0]}
  result = analysis._accuracy_by_distance(hits, {0: 20, 1: 60}, {0: value_len, 1: value_len})
  assert result["exact_match"] == [1.0, 0.0]
  if value_len > 1:
    short = analysis._accuracy_by_distance({0: [1] * (value_len - 1)}, {0: 20}, {0: value_len})
    assert short["exact_match"] == [0.0], "an answer the stream cut short is not whole"


@pytest.mark.parametrize("value_len", [0, 17, -1])
def test_value_len_is_checked(value_len):
  c = recall_config()
  c.data.recall.value_len = value_len
  with pytest.raises(ConfigError, match="value_len"):
    recall_source.validate(data_of(c.data))


def test_requery_distances_are_checked():
  c = recall_config()
  c.data.recall.requery_distances = (5,)
  with pytest.raises(ConfigError, match="requery_distances"):
    recall_source.validate(data_of(c.data))


def test_the_study_pools_accuracy_over_the_distances_beyond_a_reach():
  from experiments import recall_study as run

  acc = {
    "distance": [100, 200, 300],
    "byte_accuracy": [0.9, 0.5, 0.2],
    "exact_match": [0.8, 0.25, 0.0],
    "queries": [10, 30, 10],
  }
  far = run.beyond(acc, 150)
  assert far["queries"] == 40
  assert abs(far["answer_byte_accuracy"] - (0.5 * 30 + 0.2 * 10) / 40) < 1e-12
  assert abs(far["whole_answer_accuracy"] - 0.25 * 30 / 40) < 1e-12
  assert run.beyond(acc, 300) == {
    "queries": 0,
    "answer_byte_accuracy": None,
    "whole_answer_accuracy": None,
  }


def test_a_warm_started_runs_summary_counts_each_part_at_its_own_segments_per_step(tmp_path):
  # A run resumed from another's checkpoint with 8 segments per step where
  # the first 600 steps had 4: the steps after the start are counted at the
  # copy's config, the ones before at the source's.
  import json

  from experiments import children

  def workdir(name, segments, rows):
    wd = tmp_path / name
    wd.mkdir()
    (wd / "config.json").write_text(
      json.dumps({"batch_size": 2, "segments_per_step": segments, "model": {"segment_length": 10}})
    )
    (wd / "metrics_train.jsonl").write_text(
      "".join(
        json.dumps({"step": s, "tokens_per_second": tps, "bits_per_byte": 1.0}) + "\n"
        for s, tps in rows
      )
    )
    return str(wd)

  before = [(2, 40.0), (4, 40.0)]
  source = workdir("source", 4, before)
  copy = workdir("copy", 8, before + [(5, 80.0), (6, 160.0)])
  whole = children.train_summary(source)
  assert whole["steps"] == 4 and whole["train_tokens"] == 4 * 2 * 4 * 10
  assert abs(whole["train_seconds"] - 2 * (2 * 80) / 40.0) < 1e-12  # 80 tokens a step
  after = children.train_summary(copy, since_step=4)
  assert after["steps"] == 6 and after["train_tokens"] == 2 * 2 * 8 * 10
  assert abs(after["train_seconds"] - (160 / 80.0 + 160 / 160.0)) < 1e-12
  assert [c[0] for c in after["curve"]] == [5, 6]


def test_the_documents_are_generated_once_per_config_and_read_back(tmp_path, monkeypatch):
  from compressive.data import generated

  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  c = recall_config()
  c.data.recall.num_docs = (5, 2, 2)
  tokenizer = data_lib.get_tokenizer(c.data)
  made = {s: data_lib.get_documents(data_of(c.data), s, tokenizer) for s in data_lib.SPLITS}
  cached = sorted(p.name for p in (tmp_path / "compressive" / "generated").iterdir())
  assert len(cached) == 3 and all(n.startswith("recall-") for n in cached)

  # Read back: nothing generated, every text and query the same.
  def never(*args, **kwargs):
    raise AssertionError("generated again")

  monkeypatch.setattr(recall_source, "make_document", never)
  for split, docs in made.items():
    again = data_lib.get_documents(data_of(c.data), split, tokenizer)
    assert [again.text(i) for i in range(len(again))] == [docs.text(i) for i in range(len(docs))]
    assert [again.queries(i) for i in range(len(again))] == [
      docs.queries(i) for i in range(len(docs))
    ]
    assert [q.first for i in range(len(again)) for q in again.queries(i)]  # booleans kept
  # Another config (its seed) is other documents: generated, not read.
  c.data.recall.seed = 1
  with pytest.raises(AssertionError, match="generated again"):
    data_lib.get_documents(data_of(c.data), "test", tokenizer)
  monkeypatch.undo()
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  # A damaged file is made again and replaced.
  c.data.recall.seed = 0
  folder = tmp_path / "compressive" / "generated"
  assert generated.cache_folder() == str(folder)
  for name in cached:
    (folder / name).write_bytes(b"not an npz")
  again = data_lib.get_documents(data_of(c.data), "test", tokenizer)
  assert [again.text(i) for i in range(len(again))] == [
    made["test"].text(i) for i in range(len(made["test"]))
  ]
  assert sum((folder / name).read_bytes().startswith(b"PK") for name in cached) == 1
