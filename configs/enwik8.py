"""enwik8 with the paper's settings (Rae et al. 2020, §5.2): 0.97 bpc.

24 layers; segment 768, memory 768, compressed memory 1152, rate 3
(convolution, attention-reconstruction loss); evaluated with a compressed
memory of 3072. Width (d_model 1024, 8 heads, d_ff 3072) and dropout follow
Transformer-XL's large enwik8 model, which the paper builds on. Adam, linear
warmup to 3e-4, cosine decay, gradient-norm clip 0.1 (docs/PAPER.md §Optimisation).

    python train.py --config=configs/enwik8.py --workdir=runs/enwik8 \
        --config.data.enwik8.path=/data/enwik8.zip
"""

import ml_collections

from compressive.configs import paper


def get_config() -> ml_collections.ConfigDict:
  config = paper.base()

  m = config.model
  m.vocab_size = 256
  m.num_layers = 24
  m.num_heads = 8
  m.d_model = 1024
  m.d_ff = 3072
  m.segment_length = 768
  m.memory_length = 768
  m.compressed_memory_length = 1152
  m.compression_rate = 3

  config.data.source = "enwik8"
  config.data.tokenizer = "bytes"
  config.data.enwik8.train_shards = 128  # >= batch_size rows, each a contiguous stream

  e = config.eval
  e.batch_size = 1  # the validation / test split is one stream
  e.segment_length = 768
  e.memory_length = 768
  e.compressed_memory_length = 3072  # longer at evaluation, as the paper does
  e.max_segments = 200
  return config
