"""Transformer-XL baseline for configs/pg19.py at equal attention span:
no compressed memory, memory 512 + 512 = 1024 (docs/PAPER.md §Results: 45.5 / 36.3 ppl)."""

import ml_collections

from compressive.configs import pg19


def get_config() -> ml_collections.ConfigDict:
  config = pg19.get_config()
  config.model.memory_length = 1024
  config.model.compressed_memory_length = 0
  config.model.reconstruction_loss = "none"
  config.eval.memory_length = 1024
  config.eval.compressed_memory_length = 0
  return config
