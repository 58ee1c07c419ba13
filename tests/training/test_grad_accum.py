"""Gradient accumulation (config.grad_accum_steps): the rows of a batch in
micro-batches, one optimizer update per segment, the same update as the
full batch; resumes bit-identically; its config mistakes are one line."""

import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from compressive import config as config_lib
from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive.data import prefetch
from compressive.errors import ConfigError
from compressive.model import memory as memory_lib
from compressive.model.config import ModelConfig
from compressive.scale import mesh_checks
from compressive.training import accumulation
from compressive.training import loop as train_lib
from compressive.training import step as train_step
from compressive.training.metrics import read_jsonl
from helpers import (
  ROOT,
  TESTS,
  assert_stopped_and_resumed_like_straight,
  data_of,
  process_env,
  tiny_experiment,
  to_train,
)
import processes

# Measured (fp32, jax_default_matmul_precision=highest as conftest sets, this
# file's scenario) between grad_accum_steps=1 and 2 or 4: the micro-batches
# only reorder float sums, and the largest differences were
#   gradients (SGD with learning rate 1: new params = params - grads) 2.4e-7,
#   memories 1.7e-6 (values of order 1-10),
#   metrics relative 2.7e-7 (nats summed over 64 tokens, 1.5e-5 absolute).
# The bounds below are 40-100x those; a wrong weighting of a micro-batch (the
# reconstruction loss averaged instead of weighted by its rows' evicted slots,
# the LM loss divided by a micro-batch's own count) is 1e-3 or more here.
GRAD_TOLERANCE = 1e-5
MEMORY_TOLERANCE = 1e-4
METRIC_RTOL = 1e-5
# With the config's Adam, eps is raised from 1e-9 to 1e-6: Adam divides each
# update by the root of its squared gradients, so an entry whose gradient is
# at the float-rounding floor (~1e-10: the relative-position weights W_r
# before the memory holds anything) takes a full-size step whose sign is
# noise, a difference of the order of the learning rate (2e-4 measured).
# With eps=1e-6 such entries stay put and the measured difference was 2.2e-6.
ADAM_TOLERANCE = 1e-4


def _batches(config, steps):
  tokenizer = data_lib.get_tokenizer(data_of(config.data))
  it = data_lib.SegmentIterator(
    data_lib.get_documents(data_of(config.data), "train", tokenizer),
    batch_size=config.batch_size,
    segment_length=config.model.segment_length,
    seed=0,
  )
  return [
    prefetch.stack_segments([next(it) for _ in range(config.segments_per_step)])
    for _ in range(steps)
  ]


def _one_step(accum, recon, sgd, warmup=2):
  """((params, memory, metrics) with grad_accum_steps=1, the same with
  `accum`): `warmup` full-batch steps, then ONE step of each kind from the
  state they reached, on a batch where row 0 starts a new document: its
  micro-batch then evicts fewer valid memory slots, so the reconstruction
  loss's micro-batches weigh differently."""
  config = tiny_experiment(
    **{
      "model.memory_length": 12,  # T=8: the evicted slots are partly empty
      "model.reconstruction_loss": recon,
      "optimizer.eps": 1e-6,
    }
  )
  train = experiment_lib.TrainConfig.from_dict(config, config.model.segment_length)
  model = ModelConfig.from_config(config.model)
  graphdef, template, params = train_step.build_model(model, config.seed)
  tx = optax.sgd(1.0) if sgd else train_step.make_optimizer(train, params)
  state = train_step.create_train_state(train, params, tx)
  memory = memory_lib.init_memory(model, config.batch_size)
  batches = _batches(config, warmup + 1)
  batches[-1]["start_of_sequence"][0, 0] = True
  full = train_step.make_train_step(graphdef, template, tx, False)
  for batch in batches[:-1]:
    state, memory, _ = full(state, memory, batch)
  accumulated = train_step.make_train_step(graphdef, template, tx, False, grad_accum_steps=accum)

  def last(step):
    s, m = jax.tree.map(jnp.copy, (state, memory))  # a step donates its inputs
    s, m, metrics = step(s, m, batches[-1])
    return jax.device_get((s.params, m, metrics))

  return last(full), last(accumulated)


def _max_abs(a, b):
  return max(
    float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0.0))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


@pytest.mark.slow  # three whole train steps compiled per case
@pytest.mark.parametrize("accum,recon", [(2, "attention"), (4, "autoencoding")])
def test_accumulated_step_equals_the_full_batch_step(accum, recon):
  ref, got = _one_step(accum, recon, sgd=True)
  assert _max_abs(ref[0], got[0]) < GRAD_TOLERANCE  # params - grads: the gradients
  assert _max_abs(ref[1], got[1]) < MEMORY_TOLERANCE  # every row keeps its own memory
  assert set(ref[2]) == set(got[2])
  for k in ref[2]:
    np.testing.assert_allclose(
      np.asarray(got[2][k], np.float64),
      np.asarray(ref[2][k], np.float64),
      rtol=METRIC_RTOL,
      atol=1e-7,
      err_msg=k,
    )
  assert float(ref[2]["reconstruction_loss"][-1]) > 0  # the weighting was exercised
  # The config's optimizer (Adam) too: the same new parameters.
  ref, got = _one_step(accum, recon, sgd=False)
  assert _max_abs(ref[0], got[0]) < ADAM_TOLERANCE


def test_micro_batches_take_rows_from_every_data_shard():
  x = np.arange(16)  # 2 data shards of 8 rows, 4 micro-batches of 4 rows
  parts = np.asarray(accumulation._split_rows(x, 0, 4, 2))
  assert parts.tolist() == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
  y = np.arange(3 * 16 * 5).reshape(3, 16, 5)  # rows at axis 1, like the memory
  back = accumulation._merge_rows(accumulation._split_rows(y, 1, 4, 2), 1, 2)
  np.testing.assert_array_equal(np.asarray(back), y)


@pytest.mark.slow
def test_resume_with_accumulation_is_bit_identical(tmp_path):
  config = tiny_experiment(
    **{
      "grad_accum_steps": 2,
      "num_train_steps": 6,
      "checkpoint_every_steps": 3,
      "eval_every_steps": 0,
      "model.dropout_rate": 0.1,
    }
  )
  # Step 4's log window (steps 3-4) straddles the restart.
  assert assert_stopped_and_resumed_like_straight(config, tmp_path, 3, 4) == [2, 4, 6]


@pytest.mark.slow
def test_a_run_resumes_with_another_grad_accum_steps(tmp_path):
  # grad_accum_steps changes no shape and (without dropout, whose masks
  # depend on the micro-batches) not the maths: a run checkpointed with 2
  # resumes with 1 and ends where a run with 2 throughout ends, within the
  # float noise of Adam over 12 updates (eps raised as in ADAM_TOLERANCE).
  values = {
    "grad_accum_steps": 2,
    "num_train_steps": 6,
    "checkpoint_every_steps": 3,
    "eval_every_steps": 0,
    "optimizer.eps": 1e-6,
  }
  config = tiny_experiment(**values)
  train_lib.train_and_evaluate(to_train(config), str(tmp_path / "straight"))
  train_lib.train_and_evaluate(to_train(config), str(tmp_path / "other"), stop_at_step=3)
  train_lib.train_and_evaluate(
    to_train(tiny_experiment(**dict(values, grad_accum_steps=1))), str(tmp_path / "other")
  )
  a = read_jsonl(str(tmp_path / "straight" / "metrics_train.jsonl"))
  c = read_jsonl(str(tmp_path / "other" / "metrics_train.jsonl"))
  assert [r["step"] for r in c] == [r["step"] for r in a] == [2, 4, 6]
  np.testing.assert_allclose(c[-1]["loss"], a[-1]["loss"], rtol=1e-4)


def test_grad_accum_mistakes_are_config_errors(monkeypatch):
  for value, words in ((0, "positive integer"), (-2, "positive integer"), (3, "not divisible")):
    with pytest.raises(ConfigError, match=words) as e:
      config_lib.check(tiny_experiment(grad_accum_steps=value))
    assert "grad_accum_steps" in str(e.value) and "\n" not in str(e.value)
  # The micro-batch rows must split along the data axes like the batch's:
  # pretend a mesh of 2 data-parallel devices.
  monkeypatch.setattr(mesh_checks, "validate", lambda mesh, state, **_: (2, 1, 1))
  config_lib.check(tiny_experiment(grad_accum_steps=2))  # 2 rows each
  with pytest.raises(ConfigError, match=r"1 rows per micro-batch is not divisible by 2"):
    config_lib.check(tiny_experiment(grad_accum_steps=4))
  # Evaluating a trained config on another machine's mesh does not train.
  config_lib.check(tiny_experiment(grad_accum_steps=4), training=False)


DATA_PARALLEL = """
import sys
sys.path[:0] = [{root!r}, {tests!r}, {here!r}]
import conftest  # noqa: F401  (matmul precision)
import jax, numpy as np
from compressive import config as config_lib
from compressive.training import setup as setup_lib, step as train_step
from helpers import tiny_experiment
from test_grad_accum import _batches

assert jax.device_count() == 2
out = []
for accum in (1, 2):
  config = tiny_experiment(**{{"grad_accum_steps": accum, "batch_size": 8,
                              "optimizer.eps": 1e-6}})
  config.mesh.shape = (2, 1, 1)
  experiment = config_lib.check(config)
  setup = setup_lib.build_setup(experiment)
  tx, layout = setup.tx, setup.layout
  state = train_step.init_train_state(experiment, tx, layout)
  memory = train_step.init_sharded_memory(experiment.model, 8, layout)
  step = train_step.make_train_step(setup.graphdef, setup.state_template, tx, False, layout,
                                    grad_accum_steps=accum)
  for batch in _batches(config, 2):
    batch = {{k: jax.device_put(v, layout.batch[k]) for k, v in batch.items()}}
    state, memory, metrics = step(state, memory, batch)
  out.append(jax.device_get((memory, metrics)))
worst = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0))
            for x, y in zip(jax.tree.leaves(out[0][0]), jax.tree.leaves(out[1][0])))
sums = [{{k: float(m[k].sum()) for k in ("nats", "reconstruction_loss", "grad_norm")}}
        for _, m in out]
rel = max(abs(sums[0][k] - sums[1][k]) / max(abs(sums[0][k]), 1e-6) for k in sums[0])
print("WORST", worst, rel)
"""


@pytest.mark.slow
def test_accumulation_on_a_data_parallel_mesh(tmp_path):
  # Two fake CPU devices (the flag works only before JAX starts: a child
  # process): each micro-batch's rows split over both devices, and the memory
  # rows come back where they were.
  script = tmp_path / "dp.py"
  script.write_text(
    textwrap.dedent(
      DATA_PARALLEL.format(root=ROOT, tests=TESTS, here=os.path.dirname(os.path.abspath(__file__)))
    )
  )
  env = process_env(devices=2, JAX_PLATFORMS="cpu")
  r = processes.run(
    [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600
  )
  assert r.returncode == 0, r.stderr[-3000:]
  worst, rel = (float(v) for v in r.stdout.split("WORST")[1].split())
  assert worst < MEMORY_TOLERANCE and rel < METRIC_RTOL * 10, (worst, rel)
