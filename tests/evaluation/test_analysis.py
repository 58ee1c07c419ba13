"""The analyses: attention by position bucket and loss by position."""

import numpy as np

from compressive import data as data_lib
from compressive.evaluation import analysis
from helpers import data_of, make_model, tiny_experiment, to_evaluate


def test_attention_buckets_cover_all_banks_and_sum_to_one():
  config = tiny_experiment()
  model = make_model(config.model)
  docs = data_lib.get_documents(
    data_of(config.data), "validation", data_lib.get_tokenizer(config.data)
  )
  result = analysis.attention_by_bucket(model, docs, to_evaluate(config), buckets=2)
  assert len(result["layers"]) == config.model.num_layers and result["rows"] > 0
  assert len(result["mean"]) == 6
  # Per key weights average over queries; bank sums of per-key means sum to one.
  m, cm, t = (
    config.model.memory_length,
    config.model.compressed_memory_length,
    config.model.segment_length,
  )
  sizes = [cm / 2] * 2 + [m / 2] * 2 + [t / 2] * 2
  for layer in result["layers"]:
    assert abs(sum(v * n for v, n in zip(layer, sizes)) - 1.0) < 1e-4


def test_loss_by_position_counts_every_prediction_once():
  config = tiny_experiment()
  model = make_model(config.model)
  docs = data_lib.get_documents(
    data_of(config.data), "validation", data_lib.get_tokenizer(config.data)
  )
  result = analysis.loss_by_position(model, docs, to_evaluate(config), bucket_tokens=16)
  assert sum(result["tokens"]) == sum(docs.num_tokens(i) - 1 for i in range(len(docs)))
  assert result["start"][:3] == [0, 16, 32]
  assert all(np.isfinite(result["bits"]))
