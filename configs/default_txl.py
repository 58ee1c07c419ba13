"""Transformer-XL baseline for configs/default.py at equal attention cost.

No compressed memory: memory n_m + n_cm = 128 + 64 = 192 slots, so every
query attends to as many slots as in the Compressive Transformer run; there
is no compression network and no reconstruction loss. Everything else (data,
optimiser, steps) is the default experiment's, so the two differ only in
what happens to the oldest memories: dropped here, compressed there.
"""

import ml_collections

from compressive.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.model.memory_length = 128 + 64
  config.model.compressed_memory_length = 0
  config.model.reconstruction_loss = "none"
  return config
