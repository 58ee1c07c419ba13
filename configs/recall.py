"""Long-range recall: a small Compressive Transformer on planted facts.

Documents of filler words with facts `<KEY=VALUE>` queried `<KEY?VALUE>` a
set distance later (compressive/data/recall.py). The model is sized so the
distances straddle the reach of a Transformer-XL of equal attention cost
(configs/recall_txl.py):

  Compressive Transformer: memory 64 + compressed 64 = 128 slots per query;
    the compressed slots cover 4 x 64 = 256 older tokens, so a query at
    segment position p sees 64 + 256 + p = 320 + p tokens back in one hop,
    and num_layers x (64 + 256) = 640 at most through the layers.
  Transformer-XL: memory 128 slots; 128 + p tokens back in one hop,
    num_layers x 128 = 256 at most.

Facts are queried at distances from 24 to 344 bytes in steps of 16, so
training sees every distance, near and far, and the accuracy by distance
crosses both models' reach. Facts are dense (48 per 2048 bytes) so that a
small model learns to retrieve within minutes.
"""

import ml_collections

from compressive.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.batch_size = 32
  config.num_train_steps = 600
  config.segments_per_step = 4
  config.log_every_steps = 25
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 100

  m = config.model
  m.num_layers = 2
  m.num_heads = 4
  m.d_model = 128
  m.d_ff = 512
  m.segment_length = 64
  m.memory_length = 64
  m.compressed_memory_length = 64
  m.compression_rate = 4
  m.compression = "conv"
  m.reconstruction_loss = "attention"
  # Pre-norm: with post-norm layers (the default experiment's) neither model
  # learns to recall at all in 600 steps (docs/RESULTS.md §2, the recall
  # study's `post_norm` setting).
  m.norm = "pre"

  config.optimizer.warmup_steps = 40

  d = config.data
  d.source = "recall"
  d.recall.distances = tuple(range(24, 345, 16))
  d.recall.doc_length = 2048
  d.recall.facts = 48  # dense: about half of every document is facts and queries
  d.recall.num_docs = (4096, 64, 256)

  config.eval.split = "validation"
  config.eval.max_segments = 32
  return config
