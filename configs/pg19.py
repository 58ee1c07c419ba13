"""PG-19 with the paper's settings (Rae et al. 2020, §5.1): test ppl 33.6.

36 layers; segment, memory and compressed memory 512, rate 2 (convolution,
attention-reconstruction loss); a 32k SentencePiece vocabulary trained on the
training split. Width (d_model 1024, 8 heads, d_ff 4096) is not given in
docs/PAPER.md §Training settings; these are the paper's WikiText-103/PG-19 scale defaults. Adam,
linear warmup to 3e-4, cosine decay, gradient-norm clip 0.1.

    python train_tokenizer.py --config=configs/pg19.py \
        --config.data.pg19.data_dir=/data/tfds --config.data.spm_model=/data/pg19_32k.model
    python train.py --config=configs/pg19.py --workdir=runs/pg19 \
        --config.data.pg19.data_dir=/data/tfds --config.data.spm_model=/data/pg19_32k.model
"""

import ml_collections

from compressive.configs import paper


def get_config() -> ml_collections.ConfigDict:
  config = paper.base()

  m = config.model
  m.vocab_size = 32_000
  m.num_layers = 36
  m.num_heads = 8
  m.d_model = 1024
  m.d_ff = 4096
  m.segment_length = 512
  m.memory_length = 512
  m.compressed_memory_length = 512
  m.compression_rate = 2

  config.data.source = "pg19"
  config.data.tokenizer = "sentencepiece"
  config.data.spm_vocab_size = 32_000

  e = config.eval
  e.batch_size = 16
  e.segment_length = 512
  e.memory_length = 512
  e.compressed_memory_length = 512
  e.max_segments = 100
  return config
