"""The probe analysis: where a recalled fact is lost (compressive/evaluation/probe.py)."""

import numpy as np
import pytest

from compressive import data as data_lib
from compressive.evaluation import probe
from experiments.recall_study import pooled_probe
from helpers import data_of, make_model, tiny_experiment, to_evaluate


def probe_config(compression: str, rate: int):
  c = tiny_experiment()
  c.data.source = "recall"
  # Within memory 8 + compressed 16 x rate of a query at any segment position.
  c.data.recall.distances = (20, 28) if rate == 1 else (40, 56)
  c.data.recall.doc_length = 400
  c.data.recall.facts = 6
  c.data.recall.num_docs = (8, 3, 40)
  m = c.model
  m.compression, m.compression_rate = compression, rate
  m.segment_length, m.memory_length, m.compressed_memory_length = 8, 8, 16
  c.eval.batch_size = 8
  return c


def run_probe(c):
  docs = data_lib.get_documents(data_of(c.data), "test", data_lib.get_tokenizer(c.data))
  return probe.recall_probe(make_model(c.model), docs, to_evaluate(c))


def test_each_value_byte_is_probed_in_the_slot_that_holds_it():
  """Rate 1 mean pooling keeps each input whole, and the first layer's
  input is the byte's embedding: a probe of the right slot reads every digit
  (a slot one position off holds another, independent byte), and the control
  slots, which hold no byte of the fact, read chance."""
  r = run_probe(probe_config("mean_pool", 1))
  assert sum(r["samples"]) > 300
  first = r["layers"][0]
  assert first["probe"] == [1.0] * len(r["distance"])
  pooled = pooled_probe(r, 0)
  assert pooled["samples"] == sum(r["samples"])
  for layer in pooled["layers"]:
    assert layer["probe_control"] < 0.22  # chance 0.1; ~0.015 standard error at 400 samples
    assert 0.0 <= layer["found"] <= 1.0 and layer["value_weight"] > 0


def test_pooling_loses_part_of_a_digit_and_the_probe_says_so():
  """Max pooling at rate 2 mixes each value byte with its neighbour: the
  probe reads the digit less often than from the byte alone, and more often
  than from a slot without it."""
  r = pooled_probe(run_probe(probe_config("max_pool", 2)), 0)
  first = r["layers"][0]
  assert first["probe_control"] + 0.2 < first["probe"] < 0.98


def test_the_study_pools_only_the_distances_beyond_a_reach():
  layer = {
    k: [0.2, 0.8] for k in ("probe", "probe_control", "found", "value_weight", "other_weight")
  }
  r = {"distance": [100, 300], "samples": [10, 30], "accuracy": [0.5, 0.1], "layers": [layer]}
  assert pooled_probe(r, 200) == {
    "samples": 30,
    "accuracy": 0.1,
    "layers": [{k: 0.8 for k in layer}],
  }
  whole = pooled_probe(r, 0)
  assert whole["accuracy"] == pytest.approx((0.5 * 10 + 0.1 * 30) / 40)
  assert pooled_probe(r, 300) == {"samples": 0}


def test_a_model_without_compressed_memory_is_refused():
  c = probe_config("max_pool", 2)
  c.model.compressed_memory_length = 0
  c.model.reconstruction_loss = "none"
  with pytest.raises(ValueError, match="compressed memory"):
    run_probe(c)


def test_per_query_weights_are_what_the_mean_weights_average():
  """aux.attention_weights [L, B, H, T, K] averaged over heads and queries
  is aux.attention_by_key, whole or in chunks of queries."""
  import jax.numpy as jnp

  c = probe_config("max_pool", 2)
  model = make_model(c.model)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 8)), jnp.int32)
  memory = model.init_memory(2)
  for _ in range(4):  # fill the memories
    _, memory, _ = model(tokens, memory)
  _, _, aux = model(tokens, memory, collect_attention=True, attention_weights=True)
  assert aux.attention_weights.shape == (2, 2, 2, 8, 16 + 8 + 8)
  np.testing.assert_allclose(
    aux.attention_weights.mean((2, 3)), aux.attention_by_key, rtol=1e-5, atol=1e-7
  )
  c.model.attention_chunk_size = 4
  chunked = make_model(c.model)
  _, _, aux_chunked = chunked(tokens, memory, attention_weights=True)
  np.testing.assert_allclose(
    aux_chunked.attention_weights, aux.attention_weights, rtol=1e-5, atol=1e-6
  )
