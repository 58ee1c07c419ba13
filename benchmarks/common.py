"""Shared pieces of the benchmarks: the reference config, timed train and
streaming-evaluation loops on synthetic tokens, FLOP counting (from the
library: compressive/scale/flops.py, which the training log's MFU uses too), a
matmul roofline and memory readings. Not part of the package, not run by CI.

The reference config (issue #6): vocab 256, d_model 512, 8 layers, 8 heads,
d_ff 2048, segment 256, memory 256, compressed memory 256, rate 4, batch 4,
fp32; its Transformer-XL of equal attention span has memory 512 and no
compressed memory.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from compressive import config as config_lib
from compressive.configs import default as default_config  # noqa: E402
from compressive.evaluation import evaluate as eval_lib  # noqa: E402
from compressive.model import memory as memory_lib  # noqa: E402
from compressive.model.config import ModelConfig  # noqa: E402
from compressive.scale.flops import Flops, flops_per_token  # noqa: E402,F401  (moved to the library)
from compressive.training import step as train_step  # noqa: E402

REFERENCE_MODEL = dict(
  vocab_size=256,
  d_model=512,
  num_layers=8,
  num_heads=8,
  d_ff=2048,
  segment_length=256,
  memory_length=256,
  compressed_memory_length=256,
  compression_rate=4,
  compression="conv",
  reconstruction_loss="attention",
  # pre-norm, as the PyTorch peer and every figure measured before the
  # default experiment moved to post-norm (post saves one LN per layer).
  norm="pre",
  dropout_rate=0.0,
  dtype="float32",
)


def reference_config(
  kind: str = "ct",
  *,
  batch_size: int = 4,
  segments_per_step: int = 4,
  dtype: str = "float32",
  **model_overrides,
) -> ml_collections.ConfigDict:
  """The benchmark config: 'ct' (Compressive Transformer) or 'txl'
  (Transformer-XL with memory = memory + compressed memory, same span)."""
  config = default_config.get_config()
  config.batch_size = batch_size
  config.segments_per_step = segments_per_step
  config.num_train_steps = 1000
  for k, v in REFERENCE_MODEL.items():
    config.model[k] = v
  config.model.dtype = dtype
  for k, v in model_overrides.items():
    config.model[k] = v
  if kind == "txl":
    m = config.model
    m.memory_length = m.memory_length + m.compressed_memory_length
    m.compressed_memory_length = 0
    m.reconstruction_loss = "none"
  elif kind != "ct":
    raise ValueError(f"kind must be 'ct' or 'txl', got {kind!r}")
  return config


def _block(x):
  jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


class TrainBench:
  """Jitted training steps (segments_per_step updates each) on random bytes."""

  def __init__(self, config: ml_collections.ConfigDict, seed: int = 0):
    self.config = config
    experiment = config_lib.check(config)
    graphdef, template, params = train_step.build_model(experiment.model, experiment.train.seed)
    self.tx = train_step.make_optimizer(experiment.train, params)
    self.state = train_step.create_train_state(experiment.train, params, self.tx)
    self.num_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    b, s, t = config.batch_size, config.segments_per_step, config.model.segment_length
    self.memory = memory_lib.init_memory(experiment.model, b, jnp.dtype(config.model.dtype))
    self.step_fn = train_step.make_train_step(
      graphdef, template, self.tx, dropout=False, gradient_window=experiment.train.gradient_window
    )
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.model.vocab_size, (s, b, t + 1), dtype=np.int32)
    sos = np.zeros((s, b), bool)
    sos[0] = True
    self.batch = jax.device_put(
      dict(
        inputs=tokens[..., :-1],
        targets=tokens[..., 1:],
        mask=np.ones((s, b, t), bool),
        start_of_sequence=sos,
      )
    )
    self.tokens_per_step = s * b * t

  def compile(self) -> float:
    """Seconds to lower and compile the train step (not run)."""
    start = time.perf_counter()
    self.compiled = self.step_fn.lower(self.state, self.memory, self.batch).compile()
    return time.perf_counter() - start

  def memory_bytes(self) -> dict[str, int]:
    """The compiled step's buffers as XLA assigned them (after `compile`):
    temporaries (the working set: activations kept for the backward pass),
    arguments and outputs (state, memory, batch; donated ones aliased)."""
    m = self.compiled.memory_analysis()
    return {
      "temp": int(m.temp_size_in_bytes),
      "arguments": int(m.argument_size_in_bytes),
      "outputs": int(m.output_size_in_bytes),
      "aliased": int(m.alias_size_in_bytes),
    }

  def run(self, steps: int) -> float:
    """Tokens per second over `steps` steps (after one warm-up step)."""
    if not getattr(self, "_warm", False):
      self.state, self.memory, m = self.step_fn(self.state, self.memory, self.batch)
      _block(m)
      self._warm = True
    start = time.perf_counter()
    for _ in range(steps):
      self.state, self.memory, m = self.step_fn(self.state, self.memory, self.batch)
    _block((self.state, m))
    return steps * self.tokens_per_step / (time.perf_counter() - start)


class EvalBench:
  """Streaming evaluation: one jitted step per segment, memory threaded."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    seed: int = 0,
    model=None,
    cache_keys_values: bool = True,
  ):
    self.config = config
    cfg = ModelConfig.from_config(config.model)
    if model is None:
      graphdef, template, params = train_step.build_model(cfg, config.seed)
      from compressive.model.transformer import merge_params

      model = merge_params(graphdef, template, params)
    self.model = model
    init, self.step = eval_lib.make_eval_step(model, cache_keys_values=cache_keys_values)
    b, t = config.batch_size, config.model.segment_length
    self.carry = init(memory_lib.init_memory(cfg, b, jnp.dtype(cfg.dtype)))
    self.rng = np.random.default_rng(seed)
    self.b, self.t = b, t
    self.tokens_per_segment = b * t
    self._batches = [self._random_batch(i == 0) for i in range(8)]

  def _random_batch(self, first: bool):
    tokens = self.rng.integers(
      0, self.config.model.vocab_size, (self.b, self.t + 1), dtype=np.int32
    )
    return jax.device_put(
      dict(
        inputs=tokens[:, :-1],
        targets=tokens[:, 1:],
        mask=np.ones((self.b, self.t), bool),
        start_of_sequence=np.full((self.b,), first),
      )
    )

  def run(self, segments: int) -> float:
    """Tokens per second over `segments` segments (after one warm-up)."""
    if not getattr(self, "_warm", False):
      self.carry, nats, _ = self.step(self.carry, self._batches[0])
      _block(nats)
      self._warm = True
    start = time.perf_counter()
    for i in range(segments):
      self.carry, nats, _ = self.step(self.carry, self._batches[1 + i % 7])
    _block((self.carry, nats))
    return segments * self.tokens_per_segment / (time.perf_counter() - start)


def matmul_gflops(n: int = 2048, dtype=jnp.float32, seconds: float = 2.0) -> float:
  """Measured matmul throughput of this process's XLA backend (GFLOP/s): the
  roofline MFU divides by. Best of repeated n x n @ n x n products."""
  x = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
  f = jax.jit(lambda a, b: a @ b)
  f(x, x).block_until_ready()
  best = 0.0
  end = time.perf_counter() + seconds
  while time.perf_counter() < end:
    start = time.perf_counter()
    f(x, x).block_until_ready()
    best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
  return best


def peak_rss_mib() -> float:
  """Peak resident set size of this process so far (MiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
  """Current resident set size (MiB)."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def environment() -> dict:
  return dict(
    jax=jax.__version__,
    backend=jax.default_backend(),
    devices=[str(d) for d in jax.devices()],
    cpu_count=os.cpu_count(),
    xla_flags=os.environ.get("XLA_FLAGS", ""),
  )
