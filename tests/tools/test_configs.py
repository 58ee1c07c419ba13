"""Every experiment config loads, validates, and builds its model (abstractly:
the paper-scale models are never materialised here)."""

import importlib
import math
import pathlib

from flax import nnx
import pytest

import compressive
from compressive import cli_config
from compressive import config as config_lib
import helpers

# Every config the package ships (configs/*.py defining get_config; a preset
# taking an experiment gets its default), from the package's own listing, so
# that a new config is checked here without being listed.
CONFIGS = cli_config.config_names()


def built_shape(model) -> tuple[int, int, int]:
  """(layers, d_model, vocabulary) of a built (abstract) model, read from its
  parameters: the blocks listed, or stacked on a leading axis when scanned."""
  params = nnx.state(model, nnx.Param)
  vocab, d_model = params["embed"]["embedding"].value.shape
  blocks = params["blocks"]
  if "attention" in blocks:  # scanned: one stacked block
    layers = blocks["attention"]["wq"].value.shape[0]
  else:
    layers = len(blocks)
  return layers, d_model, vocab


def test_the_config_list_is_the_folder():
  files = {p.stem for p in pathlib.Path(helpers.ROOT, "configs").glob("*.py")}
  assert {"default", "enwik8", "pg19", "gpu8", "tpu_v5e8"} <= set(CONFIGS)
  # paper.py holds what the paper's configs share; it is no config itself.
  assert set(CONFIGS) == files - {"__init__", "paper"}


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates_and_builds(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  # The form of the config: its data (enwik8's file, PG-19's TFDS folder)
  # and its size are this machine's to check when it trains here.
  # A preset's mesh states its devices (8 for gpu8 and tpu_v5e8; -1: any).
  shape = tuple(config.mesh.shape)
  config_lib.check(config, here=False, num_devices=None if -1 in shape else math.prod(shape))
  model = nnx.eval_shape(lambda: compressive.CompressiveTransformer(config.model, rngs=nnx.Rngs(0)))
  # What was built is what the file asks for.
  assert built_shape(model) == (config.model.num_layers, config.model.d_model,
                                config.model.vocab_size)


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
