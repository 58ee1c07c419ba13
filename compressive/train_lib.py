"""Training: train state, the scanned train step, and train_and_evaluate().

Notation: S segments per step, B rows, T segment length.

One jitted call runs S consecutive segments of every row with `lax.scan`,
carrying (train state, memory) and making one optimizer update per segment,
as the paper trains (truncated BPTT over one segment). The memory is part of
the carry, never module state, and is saved with every checkpoint together
with the data iterator's position, so a resumed run sees exactly the batches
and memories it would have.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Callable, Iterator, Optional

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from compressive import checkpoint as ckpt_lib
from compressive import data as data_lib
from compressive import eval_lib
from compressive import losses
from compressive import memory as memory_lib
from compressive.config_lib import ConfigError, ModelConfig
from compressive.metrics import MetricWriter, read_jsonl
from compressive.model import CompressiveTransformer

_log = logging.getLogger("compressive")


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: optimizer updates made (one per segment)
  params: Any  # pure dict of parameters (nnx.to_pure_dict)
  opt_state: Any
  rng: jax.Array  # uint32 [2]: dropout key, folded with `step`


def build_model(config: ml_collections.ConfigDict, seed: Optional[int] = None):
  """(graphdef, abstract nnx state, initial params dict) of the config's model."""
  model = CompressiveTransformer(config.model, rngs=nnx.Rngs(config.seed if seed is None else seed))
  graphdef, state = nnx.split(model)
  return graphdef, state, nnx.to_pure_dict(state)


def merge(graphdef, state_template, params) -> CompressiveTransformer:
  state = jax.tree.map(lambda x: x, state_template)  # a copy to fill
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to the peak, then cosine decay (paper §5), in updates."""
  s = config.segments_per_step
  opt = config.optimizer
  total = max(config.num_train_steps * s, 1)
  warmup = min(opt.warmup_steps * s, total)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=opt.learning_rate, warmup_steps=warmup,
      decay_steps=max(total, warmup + 1), end_value=opt.learning_rate * opt.final_lr_fraction)


def make_optimizer(config: ml_collections.ConfigDict, params) -> optax.GradientTransformation:
  """Adam(W) with global-norm clipping; the compressor is clipped on its own.

  The compression network learns only from the reconstruction loss (§3.2);
  clipping it separately keeps that auxiliary gradient from throttling the
  language model's updates through a shared global norm.
  """
  opt = config.optimizer
  schedule = learning_rate_schedule(config)

  def base():
    if opt.name == "adamw":
      adam = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
    else:
      adam = optax.adam(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps)
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adam)

  labels = jax.tree_util.tree_map_with_path(
      lambda path, _: "compressor" if any(
          getattr(k, "key", None) == "compressor" for k in path) else "model", params)
  return optax.multi_transform({"model": base(), "compressor": base()}, labels)


def create_train_state(config, params, tx) -> TrainState:
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
      rng=jax.random.PRNGKey(config.seed + 1))


def make_train_step(graphdef, state_template, tx, dropout: bool) -> Callable:
  """jit(train_step)(state, memory, batch) -> (state, memory, metrics).

  batch: inputs, targets [S, B, T] int32; mask [S, B, T] bool;
  start_of_sequence [S, B] bool. metrics: per segment, summed over rows.
  """

  def segment(carry, seg):
    state, memory = carry
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      model = merge(graphdef, state_template, params)
      logits, new_memory, aux = model(
          seg["inputs"], memory, seg["start_of_sequence"],
          dropout_rng=rng if dropout else None)
      nats, count = losses.cross_entropy(logits, seg["targets"], seg["mask"])
      lm = nats / jnp.maximum(count, 1.0)
      # No mixing coefficient (§3.2): the two losses reach disjoint parameters.
      return lm + aux["reconstruction_loss"], (new_memory, aux, nats, count)

    grads, (new_memory, aux, nats, count) = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    metrics = dict(aux, nats=nats, tokens=count, grad_norm=optax.global_norm(grads))
    return (new_state, new_memory), metrics

  def train_step(state, memory, batch):
    (state, memory), metrics = jax.lax.scan(segment, (state, memory), batch)
    return state, memory, metrics

  return jax.jit(train_step, donate_argnums=(0, 1))


def stack_segments(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def validate_config(config: ml_collections.ConfigDict) -> ModelConfig:
  """Checks the experiment config before anything is built; ConfigError."""
  cfg = ModelConfig.from_config(config.model)
  for name in ("batch_size", "num_train_steps", "segments_per_step", "log_every_steps",
               "eval_every_steps", "checkpoint_every_steps"):
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name.endswith("_every_steps") else 1):
      raise ConfigError(f"{name}={value!r} must be a positive integer")
  if config.optimizer.name not in ("adam", "adamw"):
    raise ConfigError(f"optimizer.name={config.optimizer.name!r} is unknown; choose adam or adamw")
  if not config.optimizer.learning_rate > 0:
    raise ConfigError(f"optimizer.learning_rate={config.optimizer.learning_rate} must be > 0")
  if config.data.tokenizer == "bytes" and cfg.vocab_size < 256:
    raise ConfigError(f"model.vocab_size={cfg.vocab_size} is below 256, the bytes tokenizer's vocabulary")
  eval_lib.validate_eval_config(config, cfg)
  return cfg


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    stop_at_step: Optional[int] = None,
) -> dict[str, float]:
  """Trains (resuming from the workdir's latest checkpoint), evaluates.

  Args:
    config: the experiment config (configs/*.py).
    workdir: checkpoints, metrics and TensorBoard logs go here.
    stop_at_step: return after this step (checkpointed) instead of running to
      `num_train_steps`; the schedule is unchanged (for tests and pauses).

  Returns:
    The last evaluation's metrics (or the last training metrics).
  """
  validate_config(config)
  os.makedirs(workdir, exist_ok=True)
  ckpt_lib.save_config(workdir, config)

  tokenizer = data_lib.get_tokenizer(config.data)
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
        f"vocabulary ({tokenizer.vocab_size})")
  train_docs = data_lib.get_documents(config.data, "train", tokenizer)
  train_iter = data_lib.SegmentIterator(
      train_docs, batch_size=config.batch_size, segment_length=config.model.segment_length,
      seed=config.seed, repeat=True)
  eval_docs = data_lib.get_documents(config.data, config.eval.split, tokenizer)

  graphdef, state_template, params = build_model(config)
  tx = make_optimizer(config, params)
  state = create_train_state(config, params, tx)
  dtype = jnp.dtype(config.model.dtype)
  memory = memory_lib.init_memory(config.model, config.batch_size, dtype)
  num_params = sum(x.size for x in jax.tree.leaves(params))

  checkpointer = ckpt_lib.Checkpointer(workdir, max_to_keep=config.keep_checkpoints)
  start = checkpointer.latest_step() or 0
  writer = MetricWriter(workdir, "train")
  if start:
    state, memory, data_state = checkpointer.restore(
        start, ckpt_lib.abstract(state), ckpt_lib.abstract(memory))
    train_iter.set_state(data_state)
    _truncate_metrics(writer.jsonl, start)
    _log.info("resumed from step %d in %s", start, workdir)
  else:
    _log.info("training from scratch in %s: %d parameters", workdir, num_params)

  train_step = make_train_step(graphdef, state_template, tx, config.model.dropout_rate > 0)
  s, b, t = config.segments_per_step, config.batch_size, config.model.segment_length
  end = config.num_train_steps if stop_at_step is None else min(stop_at_step, config.num_train_steps)
  bits_name = "bits_per_byte" if config.data.tokenizer == "bytes" else "bits_per_token"
  window: list[dict[str, Any]] = []
  last_eval: dict[str, float] = {}
  t_last, steps_timed = time.time(), 0
  for step in range(start + 1, end + 1):
    batch = stack_segments([next(train_iter) for _ in range(s)])
    state, memory, metrics = train_step(state, memory, batch)
    window.append(metrics)
    steps_timed += 1
    if step == start + 1:  # exclude compilation from throughput and ETA
      jax.block_until_ready(state)
      _log.info("first step (with compilation) took %.1f s", time.time() - t_last)
      t_last, steps_timed = time.time(), 0
    if step % config.log_every_steps == 0 or step == config.num_train_steps:
      m = jax.device_get(window)
      window = []
      nats = sum(float(x["nats"].sum()) for x in m)
      count = max(sum(float(x["tokens"].sum()) for x in m), 1.0)
      elapsed = time.time() - t_last
      scalars = {
          "loss": nats / count,
          bits_name: nats / count / losses.LN2,
          "reconstruction_loss": float(np.mean([x["reconstruction_loss"] for x in m])),
          "grad_norm": float(np.mean([x["grad_norm"] for x in m])),
          "learning_rate": float(learning_rate_schedule(config)(int(state.step))),
          "tokens_per_second": steps_timed * s * b * t / max(elapsed, 1e-9) if steps_timed else 0.0,
      }
      for k in ("compressed_memory", "memory", "segment"):
        scalars[f"attention_mass/{k}"] = float(np.mean([x[f"attention_mass/{k}"] for x in m]))
      eta = (end - step) * elapsed / max(steps_timed, 1)
      writer.write(step, scalars)
      _log.info(
          "step %d/%d  loss %.4f  %s %.4f  recon %.4g  attn c/m/s %.2f/%.2f/%.2f  "
          "%.0f tok/s  ETA %s", step, config.num_train_steps, scalars["loss"],
          bits_name, scalars[bits_name], scalars["reconstruction_loss"],
          scalars["attention_mass/compressed_memory"], scalars["attention_mass/memory"],
          scalars["attention_mass/segment"], scalars["tokens_per_second"], _hms(eta))
      t_last, steps_timed = time.time(), 0
    if config.checkpoint_every_steps and (step % config.checkpoint_every_steps == 0 or step == end):
      checkpointer.save(step, state, memory, train_iter.get_state())
    if (config.eval_every_steps and step % config.eval_every_steps == 0) or step == config.num_train_steps:
      model = merge(graphdef, state_template, state.params)
      final = step == config.num_train_steps
      last_eval = eval_lib.evaluate(
          model, eval_docs, config, max_segments=None if final else config.eval.max_segments)
      MetricWriter(workdir, "eval").write(step, last_eval)
      _log.info("eval at step %d on %s: %s", step, config.eval.split,
                "  ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
      t_last = time.time()
  checkpointer.close()
  writer.close()
  return last_eval


def _truncate_metrics(path: str, step: int) -> None:
  """Drops log records written after the checkpoint a run resumes from."""
  records = [r for r in read_jsonl(path) if r["step"] <= step]
  if os.path.exists(path):
    with open(path, "w") as f:
      import json  # pylint: disable=g-import-not-at-top
      f.writelines(json.dumps(r) + "\n" for r in records)


def _hms(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def load(
    workdir: str, step: Optional[int] = None, *, config: Optional[ml_collections.ConfigDict] = None
) -> tuple[ml_collections.ConfigDict, CompressiveTransformer]:
  """(config, model) of a training workdir's latest (or given) checkpoint.

  `config` replaces the workdir's saved config (e.g. with other eval sizes);
  its model must match the checkpoint.
  """
  config = ckpt_lib.load_config(workdir) if config is None else config
  graphdef, state_template, params = build_model(config)
  tx = make_optimizer(config, params)
  state = create_train_state(config, params, tx)
  checkpointer = ckpt_lib.Checkpointer(workdir, max_to_keep=None, create=False)
  step = checkpointer.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {workdir}")
  state, _, _ = checkpointer.restore(step, ckpt_lib.abstract(state))
  checkpointer.close()
  model = merge(graphdef, state_template, state.params)
  model.eval()
  return config, model
