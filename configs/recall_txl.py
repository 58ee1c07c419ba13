"""Transformer-XL baseline for configs/recall.py at equal attention cost.

Memory 64 + 64 = 128 slots and no compressed memory: every query attends to
as many slots as in the Compressive Transformer run, reaching 128 + p tokens
back in one hop (p the position in the segment), 2 x 128 = 256 at most.
"""

import ml_collections

from compressive.configs import recall


def get_config() -> ml_collections.ConfigDict:
  config = recall.get_config()
  config.model.memory_length = 64 + 64
  config.model.compressed_memory_length = 0
  config.model.reconstruction_loss = "none"
  return config
