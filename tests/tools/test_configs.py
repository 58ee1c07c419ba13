"""Every experiment config loads, validates, and builds its model (abstractly:
the paper-scale models are never materialised here)."""

import importlib

from flax import nnx
import jax
import pytest

import compressive
from compressive import config as config_lib

CONFIGS = ["default", "enwik8", "enwik8_txl", "pg19", "pg19_txl"]


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates_and_builds(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  # The form of the config: its data (enwik8's file, PG-19's TFDS folder)
  # and its size are this machine's to check when it trains here.
  cfg = config_lib.check(config, here=False).model
  model = nnx.eval_shape(lambda: compressive.CompressiveTransformer(config.model, rngs=nnx.Rngs(0)))
  n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert n > 0
  assert cfg.num_layers == config.model.num_layers


def test_paper_settings():
  e = importlib.import_module("configs.enwik8").get_config()
  m = e.model
  assert (m.num_layers, m.segment_length, m.memory_length, m.compressed_memory_length,
          m.compression_rate) == (24, 768, 768, 1152, 3)
  assert e.eval.compressed_memory_length == 3072
  assert (e.optimizer.learning_rate, e.optimizer.grad_clip_norm) == (3e-4, 0.1)
  p = importlib.import_module("configs.pg19").get_config().model
  for baseline in ("enwik8", "enwik8_txl", "pg19", "pg19_txl"):  # Alg. 1's post-norm layers
    assert importlib.import_module(f"configs.{baseline}").get_config().model.norm == "post"
  assert (p.num_layers, p.segment_length, p.memory_length, p.compressed_memory_length,
          p.compression_rate, p.vocab_size) == (36, 512, 512, 512, 2, 32000)


@pytest.mark.parametrize("paper,baseline", [("enwik8", "enwik8_txl"), ("pg19", "pg19_txl")])
def test_baselines_have_equal_attention_span(paper, baseline):
  a = importlib.import_module(f"configs.{paper}").get_config()
  b = importlib.import_module(f"configs.{baseline}").get_config()
  assert b.model.compressed_memory_length == 0
  assert b.model.memory_length == a.model.memory_length + a.model.compressed_memory_length
  assert b.eval.memory_length == a.eval.memory_length + a.eval.compressed_memory_length
  assert b.model.num_layers == a.model.num_layers and b.model.d_model == a.model.d_model
