"""Transformer-XL baseline for configs/enwik8.py at equal attention span.

No compressed memory; memory n_m + n_cm = 768 + 1152 = 1920 in training and
768 + 3072 = 3840 at evaluation. Everything else as the Compressive
Transformer run, so the two differ only in what happens to old memories.
"""

import ml_collections

from compressive.configs import enwik8


def get_config() -> ml_collections.ConfigDict:
  config = enwik8.get_config()
  config.model.memory_length = 768 + 1152
  config.model.compressed_memory_length = 0
  config.model.reconstruction_loss = "none"
  config.eval.memory_length = 768 + 3072
  config.eval.compressed_memory_length = 0
  return config
