"""The tests' shared helpers: the repository's root, tiny model configs and
experiments, config files for the entry points, and comparisons of runs.

Test files import this module (`from helpers import ...`), never each other:
pytest puts tests/ on sys.path (`pythonpath` in pyproject.toml), and the
processes and config files the tests start put it there themselves
(`sys.path.insert(0, TESTS)`), so it is found by that name in every process.
"""

import hashlib
import os
import textwrap
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import compressive
from compressive.configs import default
from compressive.training.metrics import read_jsonl

# The tests folder (where this module is) and the repository root above it.
TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


# The session's compilation is JAX's `jax_disable_most_optimizations`
# (conftest.py); a process started with these variables compiles as users'
# runs do, at XLA's default level.
DEFAULT_LEVEL = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "0"}


def process_env(devices: Optional[int] = None, **more: str) -> dict[str, str]:
  """The environment for a process the tests start: this one's, with
  `devices` fake CPU devices (JAX's JAX_NUM_CPU_DEVICES; default: JAX's one)
  in place of any device count the session has (there or in XLA_FLAGS),
  and `more` (e.g. **DEFAULT_LEVEL)."""
  env = dict(os.environ)
  env.pop("JAX_NUM_CPU_DEVICES", None)
  flags = [
    f
    for f in env.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  env["XLA_FLAGS"] = " ".join(flags)
  if devices is not None:
    env["JAX_NUM_CPU_DEVICES"] = str(devices)
  env.update(more)
  return env


# -- Tiny models. ----------------------------------------------------------------


def tiny_model_config(**overrides) -> compressive.ModelConfig:
  values = dict(
    vocab_size=32,
    num_layers=2,
    num_heads=2,
    d_model=16,
    d_ff=32,
    segment_length=4,
    memory_length=8,
    compressed_memory_length=4,
    compression_rate=2,
    compression="conv",
    reconstruction_loss="attention",
    dropout_rate=0.0,
    dtype="float32",
  )
  values.update(overrides)
  return compressive.ModelConfig.from_config(values)


def make_model(cfg, seed: int = 0):
  """The model of a ModelConfig, or of a config's model section (read once
  here, as the tools read it)."""
  from flax import nnx

  if not isinstance(cfg, compressive.ModelConfig):
    cfg = compressive.ModelConfig.from_config(cfg)
  return compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(seed))


def jitted_forward(model):
  """(state, jit(fn)) with fn(state, tokens, memory, sos) -> model outputs."""
  from flax import nnx

  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens, memory, sos):
    return nnx.merge(graphdef, state)(tokens, memory, sos)

  return state, forward


def run_segments(forward, state, tokens, memory, t):
  outs = []
  for s in range(tokens.shape[1] // t):
    logits, memory, aux = forward(state, tokens[:, s * t : (s + 1) * t], memory, None)
    outs.append(logits)
  return jnp.concatenate(outs, 1), memory


def greedy_without_cache(cfg, model, prompt, n):
  """Segment-by-segment greedy decoding: every token re-runs its segment so far
  (padded to a whole segment; causality makes the padding irrelevant)."""
  state, forward = jitted_forward(model)
  t = cfg.segment_length
  memory = compressive.init_memory(cfg, 1)
  seq = list(prompt)
  done = 0  # tokens already pushed into memory
  out = []
  while len(out) < n:
    while len(seq) - done >= t:  # push complete segments into memory
      logits, memory, _ = forward(state, jnp.asarray([seq[done : done + t]]), memory, None)
      done += t
    part = seq[done:]
    if part:
      padded = jnp.asarray([part + [0] * (t - len(part))])
      logits, _, _ = forward(state, padded, memory, None)
      nxt = int(jnp.argmax(logits[0, len(part) - 1]))
    else:  # the last pushed segment's final logits
      nxt = int(jnp.argmax(logits[0, -1]))
    seq.append(nxt)
    out.append(nxt)
  return out


# -- Tiny experiments and their config files. ------------------------------------


def tiny_experiment(**overrides):
  c = default.get_config()
  c.data.source = "synthetic"
  c.data.synthetic.kind = "copy"
  c.data.synthetic.period = 12
  c.data.synthetic.num_docs = (16, 4, 4)
  c.data.synthetic.min_length = 40
  c.data.synthetic.max_length = 120
  m = c.model
  m.num_layers, m.d_model, m.d_ff, m.num_heads = 2, 32, 64, 2
  m.segment_length, m.memory_length, m.compressed_memory_length = 8, 8, 4
  c.batch_size = 4
  c.segments_per_step = 2
  c.num_train_steps = 12
  c.log_every_steps = 2
  c.eval_every_steps = 6
  c.checkpoint_every_steps = 3
  c.eval.max_segments = 4
  c.optimizer.warmup_steps = 2
  for k, v in overrides.items():
    target = c
    *path, last = k.split(".")
    for p in path:
      target = target[p]
    target[last] = v
  return c


def checked(config):
  """`config` (a ConfigDict) as the Experiment a reader makes of it
  (config.check, not to train, nothing asked of this machine)."""
  from compressive import config as config_lib

  return config_lib.check(config, training=False, here=False, num_devices=1)


def run_identity_of(config=None):
  """The identity a trainer records in its checkpoints for `config`
  (default tiny_experiment()): for tests that save a checkpoint themselves."""
  from compressive.model.config import ModelConfig
  from compressive.training import integrity

  config = tiny_experiment() if config is None else config
  from compressive import data as data_lib

  data = data_of(config.data)
  return integrity.run_identity(
    ModelConfig.from_config(config.model),
    data_lib.get_tokenizer(data).identity,
    data_lib.corpus_identity(data),
    data_lib.data_identity(data),
  )


def untrained_workdir(workdir, config=None, step=1):
  """A workdir as training leaves it (config.json, checkpoint `step` with its
  integrity record and the run's identity), holding a freshly initialised
  state: for readers' and exports' tests, in seconds instead of a compiled
  training run. Returns the workdir's path as a string."""
  from compressive import config as config_lib
  from compressive.training import checkpoint as ckpt_lib
  from compressive.training import runconfig
  from compressive.training import setup as setup_lib
  from compressive.training import step as train_step

  config = tiny_experiment() if config is None else config
  experiment = config_lib.check(config)
  setup = setup_lib.build_setup(experiment)
  state = train_step.init_train_state(experiment, setup.tx, setup.layout)
  memory = train_step.init_sharded_memory(experiment.model, config.batch_size, setup.layout)
  checkpointer = ckpt_lib.Checkpointer(str(workdir))
  checkpointer.save(
    step,
    state,
    memory,
    {"position": np.zeros(config.batch_size, np.int64)},
    run_identity_of(config),
  )
  checkpointer.close()
  runconfig.save_config(str(workdir), experiment)
  return str(workdir)


def sharding_experiment(**overrides):
  """Tiny, with 8 rows (every test mesh splits them) and dropout (its masks
  must not depend on the mesh); checkpoints at steps 10 and 20."""
  values = {
    "batch_size": 8,
    "num_train_steps": 20,
    "log_every_steps": 1,
    "eval_every_steps": 0,
    "checkpoint_every_steps": 10,
    "model.dropout_rate": 0.1,
  }
  values.update(overrides)
  return tiny_experiment(**values)


def write_config_file(path, overrides=None, *, preamble="", factory="helpers:tiny_experiment"):
  """A config file for train.py and the other entry points (run in another
  process): `get_config()` returns `factory(**overrides)`, a function of a
  module in tests/. `preamble` is Python run first (e.g. to patch something)."""
  module, function = factory.split(":")
  with open(path, "w") as f:
    f.write(
      f"import sys\nsys.path.insert(0, {TESTS!r})\nfrom {module} import {function}\n"
      f"{textwrap.dedent(preamble)}\n\n"
      f"def get_config():\n  return {function}(**{dict(overrides or {})!r})\n"
    )
  return str(path)


# -- Comparing runs. -------------------------------------------------------------


def assert_resumed_like_straight(straight, resumed, straddling_step):
  """The resumed run logged what the uninterrupted one did, bit for bit,
  except the record whose log window straddles the restart, and ended with
  the same parameters. Returns the logged steps."""
  a = read_jsonl(str(straight / "metrics_train.jsonl"))
  b = read_jsonl(str(resumed / "metrics_train.jsonl"))
  assert [r["step"] for r in a] == [r["step"] for r in b]
  for ra, rb in zip(a, b):
    if ra["step"] == straddling_step:
      continue
    for k in ("loss", "reconstruction_loss", "grad_norm"):
      assert ra[k] == rb[k], (ra["step"], k)
  assert_same_parameters(straight, resumed)
  return [r["step"] for r in a]


def assert_stopped_and_resumed_like_straight(config, tmp_path, stop_at_step, straddling_step):
  """Trains `config` straight, and again stopped at `stop_at_step` (a
  checkpoint) and resumed, in process; asserts the two alike
  (assert_resumed_like_straight). Returns the logged steps."""
  from compressive.training import loop

  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  config = to_train(config)
  loop.train_and_evaluate(config, str(straight))
  loop.train_and_evaluate(config, str(resumed), stop_at_step=stop_at_step)
  loop.train_and_evaluate(config, str(resumed))
  return assert_resumed_like_straight(straight, resumed, straddling_step)


def assert_same_parameters(workdir_a, workdir_b):
  """The two workdirs' latest models hold bit-identical parameters."""
  from flax import nnx

  _, a = compressive.load(str(workdir_a))
  _, b = compressive.load(str(workdir_b))
  for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def params_of(workdir):
  from flax import nnx

  _, model = compressive.load(str(workdir))
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def assert_same_params(a, b):
  for x, y in zip(params_of(a), params_of(b)):
    np.testing.assert_array_equal(x, y)


def tree_digest(path):
  """A digest of every file under `path` but a checkpoints folder's record
  of its workdir (layout.OWNER_FILE), which a copied workdir's trainer writes
  again before it reads anything."""
  h = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(path)):
    dirs.sort()
    for name in sorted(files):
      if root == str(path) and name == "workdir.json":
        continue
      p = os.path.join(root, name)
      h.update(p.encode())
      with open(p, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def inject_nan_at(monkeypatch, bad_step, *, value=float("nan"), after=False):
  """Makes the real train step see parameters times `value` (NaN) at
  `bad_step`; with `after`, the step computes on good parameters (its loss
  and gradient finite) and returns them times `value`: what an overflowing
  learning rate or weight decay does."""
  from compressive.training import step as train_step

  make = train_step.make_train_step
  poison = lambda state: state.replace(
    params=jax.tree.map(lambda p: p * np.float32(value), state.params)
  )

  def patched(*args, **kwargs):
    step_fn = make(*args, **kwargs)
    calls = {"n": 0}

    def wrapped(state, memory, batch):
      calls["n"] += 1
      bad = calls["n"] == bad_step
      if bad and not after:
        state = poison(state)
      state, memory, metrics = step_fn(state, memory, batch)
      return (poison(state) if bad and after else state), memory, metrics

    return wrapped

  monkeypatch.setattr(train_step, "make_train_step", patched)


# -- Text. -----------------------------------------------------------------------


WORDS = (
  "the king queen crown sword castle night morning river stone "
  "über naïve café dragon whisper thunder"
).split()


def generated_texts(n, seed=0):
  rng = np.random.default_rng(seed)
  texts = []
  for _ in range(n):
    lines = []
    for _ in range(rng.integers(20, 60)):
      k = rng.integers(0, 12)
      lines.append(" ".join(rng.choice(WORDS, size=k)))
    texts.append("\n".join(lines))
  return texts


def sentencepiece_run_fields(folder) -> dict:
  """Overrides for a run on a SentencePiece tokenizer: 12 generated books in
  FOLDER/texts, and a 320-piece model trained at FOLDER/m.model."""
  from compressive import data as data_lib

  texts = folder / "texts"
  texts.mkdir()
  for i, text in enumerate(generated_texts(12)):
    (texts / f"book{i}.txt").write_text(text)
  model = folder / "m.model"
  data_lib.train_sentencepiece(generated_texts(30), 320, str(model))
  return {
    "data.source": "text_files",
    "data.text_files.path": str(texts),
    "data.tokenizer": "sentencepiece",
    "data.spm_model": str(model),
    "model.vocab_size": 320,
  }


def to_train(config):
  """`config` checked to train here (config.check), as train.py checks it
  before `train_and_evaluate`."""
  from compressive import config as config_lib

  return config_lib.check(config)


def to_evaluate(config):
  """`config` checked to evaluate here (config.check, training=False), as
  the tools check one before `evaluate` and the analyses."""
  from compressive import config as config_lib

  return config_lib.check(config, training=False)


def data_of(section):
  """A config's data section (a ConfigDict) as the typed DataConfig that
  config.check builds and every data function takes."""
  from compressive import data as data_lib

  return data_lib.DataConfig.from_dict(section)


def copy_tree(path, tmp_path, name="copy"):
  """A copy of the folder `path` (a workdir, an export) at tmp_path/name."""
  import shutil

  target = tmp_path / name
  shutil.copytree(path, target)
  return target


def edit_json(path, edit):
  """Rewrites the JSON file at `path` with `edit` applied to its value."""
  import json

  with open(path) as f:
    value = json.load(f)
  edit(value)
  with open(path, "w") as f:
    json.dump(value, f)
