"""The recall study's settings (experiments/recall_study.py runs them):
each a name, what it changes, and the overrides of both models and of the
Compressive Transformer alone, against configs/recall.py and
configs/recall_txl.py."""

# The recall study: configs/recall.py (Compressive Transformer) against
# configs/recall_txl.py (Transformer-XL, memory = CT memory + compressed
# memory: equal attention cost), one thing changed at a time.
# name -> (what changes, overrides of both models, overrides of the CT only)
_REQUERY = ("--config.data.recall.requery_distances=(56,64,72)", "--config.data.recall.facts=32")
_MOST_USED = ("--config.model.compression=most_used",)
RECALL_STUDY = {
  "base": ("configs/recall.py as it is: rate 4, conv, attention loss, 600 steps", (), ()),
  "post_norm": (
    "post-norm layers (the paper's, and the default experiment's)",
    ("--config.model.norm=post",),
    (),
  ),
  "rate2": (
    "compression rate 2 (compressed reach 128, not 256)",
    (),
    ("--config.model.compression_rate=2",),
  ),
  "steps_x2": ("2x the training steps (1,200)", ("--config.num_train_steps=1200",), ()),
  "most_used": ("most-used selection (keeps 1 in 4 evicted slots verbatim)", (), _MOST_USED),
  "autoencoding": (
    "the auto-encoding loss for the conv",
    (),
    ("--config.model.reconstruction_loss=autoencoding",),
  ),
  "wide": (
    "a wider model: d_model 256, d_ff 1024",
    ("--config.model.d_model=256", "--config.model.d_ff=1024"),
    (),
  ),
  "requery": (
    "each fact queried twice: at 56-72 bytes, then at 24-344 bytes after that "
    "query (32 facts per document, so the events' density is unchanged)",
    _REQUERY,
    (),
  ),
  # The requery setting's three near distances taught both models a
  # positional shortcut (docs/RESULTS.md §2); here the first query is at one
  # of 13 distances, 24-120 bytes, so that finding the fact takes its key.
  "most_used_requery": (
    "most-used selection, and each fact queried twice: at 24-120 bytes "
    "(13 distances), then at 24-344 bytes after that query "
    "(32 facts per document)",
    (
      "--config.data.recall.requery_distances=" + str(tuple(range(24, 121, 8))).replace(" ", ""),
      "--config.data.recall.facts=32",
    ),
    _MOST_USED,
  ),
}
# Every compression function at the task's four-digit values and at one
# digit (the task's documents, facts, distances and cost, each value one
# digit long): which keep a fact past the Transformer-XL's reach, and which
# keep its order. `base` and `most_used` are the convolution's and most-used
# selection's four-digit settings; a one-digit setting's Transformer-XL is
# trained on the same one-digit documents.
ONE_DIGIT = ("--config.data.recall.value_len=1",)
_FUNCTIONS = {
  "max_pool": "max pooling",
  "mean_pool": "mean pooling",
  "conv": "the convolution",
  "dilated_conv": "the dilated convolution",
  "most_used": "most-used selection",
  "overlap_max_pool": "max pooling over overlapping windows (2c slots, stride c)",
}
# Learned selections (beyond the paper; experiments/compressions.py), measured
# below the pooling they were meant to improve on.
_PLUGINS = {
  "attention_pool": (
    "learned selection (attention pooling, one head)",
    "experiments.compressions:AttentionPool",
  ),
  "ordered_pool": (
    "learned ordered selection (attention pooling, a head per position)",
    "experiments.compressions:OrderedPool",
  ),
}
for _fn, (_what, _path) in _PLUGINS.items():
  RECALL_STUDY[_fn] = (
    f"{_what} (rate 4), four-digit values",
    (),
    ("--config.model.compression=" + _path,),
  )
  RECALL_STUDY[f"{_fn}_1digit"] = (
    f"{_what} (rate 4), one-digit values",
    ONE_DIGIT,
    ("--config.model.compression=" + _path,),
  )
for _fn, _what in _FUNCTIONS.items():
  _ct = ("--config.model.compression=" + _fn,) if _fn != "conv" else ()
  if _fn not in ("conv", "most_used"):
    RECALL_STUDY[_fn] = (f"{_what} (rate 4), four-digit values", (), _ct)
  RECALL_STUDY[f"{_fn}_1digit"] = (f"{_what} (rate 4), one-digit values", ONE_DIGIT, _ct)
# The task-taught compression (model.memory_gradient, beyond the paper): one
# update per window of 8 segments (512 bytes). A fact is compressed in the
# segment after its own, and queried 264-344 bytes (4-6 segments) later, so
# 3 to 5 of every 8 such pairs fall in one window. 8 segments per step and
# 300 steps read the bytes `base` reads, in 300 updates of 8 segments (base:
# 2,400 of one). Each Transformer-XL gets the same window and data; where
# the memories keep their gradient, its memories do too (equal cost, equal
# training signal).
_WINDOW = (
  "--config.segments_per_step=8",
  "--config.gradient_window=8",
  "--config.num_train_steps=300",
)
RECALL_STUDY.update(
  {
    "taught": (
      "task-taught compression: the LM loss of the next 7 segments reaches the conv "
      "through the compressed memory (model.memory_gradient=compressor, "
      "gradient_window=8, 8 segments per step), beside its attention-reconstruction "
      "loss; the Transformer-XL with the same window and data",
      _WINDOW,
      ("--config.model.memory_gradient=compressor",),
    ),
    # `taught` with more than three times its updates: 1,000 windows of 8
    # segments, 3.3 times `base`'s bytes (docs/RESULTS.md §2: 300 updates
    # learned no retrieval at all, at any distance).
    "taught_long": (
      "task-taught compression as in `taught`, with 1,000 updates of 8 segments "
      "(3.3x base's bytes); the Transformer-XL the same",
      _WINDOW[:2] + ("--config.num_train_steps=1000",),
      ("--config.model.memory_gradient=compressor",),
    ),
    "taught_memories": (
      "task-taught memories: the LM loss of the next 7 segments reaches every "
      "stored slot, the conv and the layers that wrote them "
      "(model.memory_gradient=memories, gradient_window=8), both models",
      _WINDOW + ("--config.model.memory_gradient=memories",),
      (),
    ),
  }
)
# Settings that start from another setting's trained models: each model's
# workdir is a copy of that setting's, resumed with the overrides (the
# optimizer state and the data position go on; the learning rate follows
# the new num_train_steps' schedule from the step it resumes at).
# name -> the setting it starts from.
#
# The task-taught window as fine-tuning: `base` has learned to retrieve
# from its uncompressed memory in 600 steps, where `taught` from nothing
# learned no retrieval in 300 windows; here its 600 steps go on for 300
# windows of 8 segments with the LM loss reaching the conv (the
# Transformer-XL: its `base`, the same window and data).
WARM_START = {"taught_finetune": "base", "taught_memories_finetune": "base"}
RECALL_STUDY["taught_finetune"] = (
  "`base`'s models (600 steps), then 300 windows of 8 segments with the task-taught "
  "compression (model.memory_gradient=compressor, gradient_window=8); the Transformer-XL: "
  "its `base`, then the same window and data",
  _WINDOW[:2] + ("--config.num_train_steps=900",),
  ("--config.model.memory_gradient=compressor",),
)
RECALL_STUDY["taught_memories_finetune"] = (
  "`base`'s models (600 steps), then 300 windows of 8 segments with the task-taught "
  "memories (model.memory_gradient=memories: the LM loss of the next 7 segments reaches "
  "every stored slot, the conv and the layers that wrote them), both models",
  _WINDOW[:2] + ("--config.num_train_steps=900", "--config.model.memory_gradient=memories"),
  (),
)
# Wider windows, from experiments/compressions.py (not part of the package).
_OVERLAP3 = ("--config.model.compression=experiments.compressions:Overlap3MaxPool",)
RECALL_STUDY["overlap3_max_pool"] = (
  "max pooling over overlapping windows of 3c slots (stride c), four-digit values",
  (),
  _OVERLAP3,
)
RECALL_STUDY["overlap3_max_pool_1digit"] = (
  "max pooling over overlapping windows of 3c slots (stride c), one-digit values",
  ONE_DIGIT,
  _OVERLAP3,
)
# The compressed slots read through projections of their own
# (model.compressed_keys_values=own, beyond the paper): the probe found the
# convolution's slots holding the fact, its digits in order, and the model
# not reading them through the projections the raw memories use.
for _fn in ("conv", "overlap_max_pool"):
  _what, _both, _ct = RECALL_STUDY[f"{_fn}_1digit"]
  _own = _ct + ("--config.model.compressed_keys_values=own",)
  RECALL_STUDY[f"{_fn}_own_1digit"] = (f"{_what}; compressed slots' own W_k, W_v", _both, _own)
  RECALL_STUDY[f"{_fn}_own"] = (
    f"{_what.replace('one-digit', 'four-digit')}; compressed slots' own W_k, W_v",
    (),
    _own,
  )
# More seeds (config.seed: initialisation and data order) where a setting decides a finding.
for _name, _seed in (
  ("max_pool_1digit", 1),
  ("max_pool_1digit", 2),
  ("conv_1digit", 1),
  ("overlap_max_pool_1digit", 1),
  ("overlap_max_pool_1digit", 2),
  ("overlap_max_pool", 1),
  ("overlap_max_pool_own_1digit", 1),
  ("overlap_max_pool_own_1digit", 2),
):
  _what, _both, _ct = RECALL_STUDY[_name]
  _both += (f"--config.seed={_seed}",)
  RECALL_STUDY[f"{_name}_seed{_seed}"] = (f"{_what}; seed {_seed}", _both, _ct)

# The task's gradient where a selective compression can use it: a trained
# setting's two models go on for 300 windows of 8 segments with the loss of
# later segments reaching the compression (`_taught`: model.memory_gradient=
# compressor, the CT alone) or every stored slot (`_taught_memories`: both
# models); a checkpoint every 50 windows, each measured (the curve of
# windows against recall past the reach).
_CURVE = ("--config.checkpoint_every_steps=50", "--config.keep_checkpoints=10")
for _start in (
  "attention_pool_1digit",
  "max_pool_1digit",
  "ordered_pool_1digit",
  "overlap_max_pool_1digit",
  "ordered_pool",
  "attention_pool",
  "overlap_max_pool",
):
  _, _both, _start_ct = RECALL_STUDY[_start]
  WARM_START[f"{_start}_taught"] = _start
  RECALL_STUDY[f"{_start}_taught"] = (
    f"`{_start}`'s models (600 steps), then 300 windows of 8 segments with the LM loss "
    "reaching the compression (model.memory_gradient=compressor); the Transformer-XL: its "
    "start, then the same window and data",
    _both + _WINDOW[:2] + ("--config.num_train_steps=900",) + _CURVE,
    _start_ct + ("--config.model.memory_gradient=compressor",),
  )
  WARM_START[f"{_start}_taught_memories"] = _start
  RECALL_STUDY[f"{_start}_taught_memories"] = (
    f"`{_start}`'s models (600 steps), then 300 windows of 8 segments with the LM loss "
    "reaching every stored slot, the compression and the layers that wrote them "
    "(model.memory_gradient=memories), both models",
    _both
    + _WINDOW[:2]
    + ("--config.num_train_steps=900", "--config.model.memory_gradient=memories")
    + _CURVE,
    _start_ct,
  )
# Longer training: a setting's two models go on to 1,200 steps (the
# learning rate following a schedule to step 1,200 from the step they resume
# at), measured every 50 steps; the one-digit setting at each of its seeds.
for _start in (
  "overlap_max_pool_1digit",
  "overlap_max_pool",
  "overlap_max_pool_1digit_seed1",
  "overlap_max_pool_1digit_seed2",
):
  _, _both, _start_ct = RECALL_STUDY[_start]
  WARM_START[f"{_start}_longer"] = _start
  RECALL_STUDY[f"{_start}_longer"] = (
    f"`{_start}`'s models (600 steps) trained on to 1,200 steps, both models",
    _both + ("--config.num_train_steps=1200",) + _CURVE,
    _start_ct,
  )
CURVE_SETTINGS = {n for n, (_, both, _) in RECALL_STUDY.items() if _CURVE[0] in both}
CHANCE = {"answer_byte": 0.1, "whole_answer": 1e-4}
