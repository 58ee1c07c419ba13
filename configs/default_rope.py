"""configs/default.py with rotary position embeddings instead of Transformer-XL
relative positions: for comparing quality with relative positions on the
default corpus (same data, model size, memory and optimiser; the only change
is model.positions, which also drops each layer's W_r, u and v).
"""

import ml_collections

from compressive.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.model.positions = "rope"
  return config
