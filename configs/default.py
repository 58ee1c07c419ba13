"""The default experiment: a small byte-level Compressive Transformer.

Sized for a laptop CPU. Override any field from the command line, e.g.
`--config.model.compression_rate=4`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  model = config.model = ml_collections.ConfigDict()
  model.vocab_size = 256  # bytes
  model.num_layers = 4
  model.num_heads = 4
  model.d_model = 256
  model.d_ff = 1024
  model.segment_length = 128  # n_s
  model.memory_length = 128  # n_m
  model.compressed_memory_length = 64  # n_cm
  model.compression_rate = 2  # c
  model.compression = "conv"  # max_pool | mean_pool | conv | dilated_conv | most_used
  model.reconstruction_loss = "attention"  # attention | autoencoding | none
  model.dropout_rate = 0.0
  model.dtype = "float32"  # activations: float32 | bfloat16 (parameters stay float32)
  return config
