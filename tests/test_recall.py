"""The long-range recall source and its accuracy-by-distance evaluation."""

import numpy as np

from compressive import analysis
from compressive import data as data_lib
from conftest import make_model
from test_train import tiny_experiment


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
  docs = data_lib.get_documents(c.data, "validation", data_lib.get_tokenizer(c.data))
  for i in range(len(docs)):
    text = docs.text(i)
    assert len(text.encode()) == 200
    assert docs.queries(i), "every document has queries"
    for q in docs.queries(i):
      query_start = q.answer_start - 6
      key, value = text[query_start + 1:query_start + 5], text[q.answer_start:q.answer_start + 4]
      assert text[query_start + 5] == "?"
      fact = text[query_start - q.distance:query_start - q.distance + 11]
      assert fact == f"<{key}={value}>"
      assert q.distance in (20, 60)


def test_an_oracle_free_model_is_scored_on_every_answer():
  c = recall_config()
  docs = data_lib.get_documents(c.data, "validation", data_lib.get_tokenizer(c.data))
  result = analysis.recall_accuracy(make_model(c.model), docs, c)
  assert sum(result["queries"]) == sum(len(docs.queries(i)) for i in range(len(docs)))
  assert set(result["distance"]) <= {20, 60}
  assert all(0.0 <= a <= 1.0 for a in result["byte_accuracy"])
  assert np.all(np.asarray(result["exact_match"]) <= np.asarray(result["byte_accuracy"]) + 1e-9)
