"""What the paper's large runs share (docs/PAPER.md §Optimisation): run length, logging,
post-norm layers, and the optimiser — Adam, linear warmup to 3e-4, cosine decay, gradient-norm clip
0.1 ("crucial"). Not an experiment itself: configs/enwik8.py and pg19.py
start from `base()` and set their model and data."""

import ml_collections

from compressive.configs import default


def base() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.batch_size = 32
  config.num_train_steps = 100_000  # x 4 segments = 400k updates
  config.segments_per_step = 4
  config.log_every_steps = 100
  config.eval_every_steps = 5_000
  config.checkpoint_every_steps = 1_000
  config.model.dropout_rate = 0.1
  # Alg. 1 and Transformer-XL: LN after each residual sum, no final LN; the
  # optimiser settings below were tuned for it.
  config.model.norm = "post"
  config.model.dtype = "bfloat16"
  # 24 to 36 layers: one scanned layer compiles once, not 36 times. Scanned,
  # every layer's activations are kept for the backward pass unless remat
  # recomputes them: pg19 on a v5e-8 needs 18.3 GiB a chip without, 5.4 GiB
  # keeping only the weight matmuls' outputs (aot.py, docs/SCALING.md
  # §Before renting the hardware).
  config.model.scan_layers = True
  config.model.remat = "matmuls"
  config.model.compression = "conv"  # the paper's best: conv + attention loss
  config.model.reconstruction_loss = "attention"

  o = config.optimizer
  o.name = "adam"
  o.learning_rate = 3e-4
  o.warmup_steps = 1_000  # x 4 = 4k updates
  o.final_lr_fraction = 0.0
  o.b2 = 0.999
  o.eps = 1e-8
  o.grad_clip_norm = 0.1
  return config
