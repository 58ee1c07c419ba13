"""PG-19 with the paper's settings (Rae et al. 2020, §5.1): test ppl 33.6.

36 layers; segment, memory and compressed memory 512, rate 2 (convolution,
attention-reconstruction loss); a 32k SentencePiece vocabulary trained on the
training split. Width (d_model 1024, 8 heads, d_ff 4096) is not given in
PAPER.md; these are the paper's WikiText-103/PG-19 scale defaults. Adam,
linear warmup to 3e-4, cosine decay, gradient-norm clip 0.1.

    python train_tokenizer.py --config=configs/pg19.py \
        --config.data.data_dir=/data/tfds --config.data.spm_model=/data/pg19_32k.model
    python train.py --config=configs/pg19.py --workdir=runs/pg19 \
        --config.data.data_dir=/data/tfds --config.data.spm_model=/data/pg19_32k.model
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.batch_size = 32
  config.num_train_steps = 100_000  # x 4 segments = 400k updates
  config.segments_per_step = 4
  config.log_every_steps = 100
  config.eval_every_steps = 5_000
  config.checkpoint_every_steps = 1_000

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
  m.compression = "conv"
  m.reconstruction_loss = "attention"
  m.dropout_rate = 0.1
  m.dtype = "bfloat16"

  o = config.optimizer
  o.name = "adam"
  o.learning_rate = 3e-4
  o.warmup_steps = 1_000
  o.final_lr_fraction = 0.0
  o.b2 = 0.999
  o.eps = 1e-8
  o.grad_clip_norm = 0.1

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
