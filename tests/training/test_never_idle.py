"""The loop keeps the device busy: it dispatches a step while the previous
one computes, reads nothing from the device in an ordinary step, makes its
input ahead in a background thread (and resumes exactly from what it
consumed, not what it made ahead), and reads the metric window in one
transfer."""

import functools
import threading
import time

import jax
from jax._src import array as array_lib
import jax.numpy as jnp
import numpy as np
import pytest

from compressive import data as data_lib
from compressive.data import prefetch
from compressive.errors import DataError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import loop as train_lib
from compressive.training import runlog
from compressive.training import step as train_step
from helpers import assert_same_params, data_of, tiny_experiment, to_train

STEPS = 12


def config(**overrides):
  # Due steps: logs at 4, 8 and 12, saves at 6 and 12 (the end); no evaluation.
  values = {
    "num_train_steps": STEPS,
    "log_every_steps": 4,
    "checkpoint_every_steps": 6,
    "eval_every_steps": 0,
  }
  values.update(overrides)
  return tiny_experiment(**values)


def due(step):
  return step % 4 == 0 or step % 6 == 0 or step == STEPS


def busy_loop(seconds):
  """A jitted (x, n) -> x after n data-dependent 256 x 256 matmuls, and the n
  that takes about `seconds` here (measured)."""

  @jax.jit
  def spin(x, n):
    return jax.lax.fori_loop(0, n, lambda i, y: jnp.tanh(y @ y) * 0.5, x)

  x = jnp.eye(256, dtype=jnp.float32)
  spin(x, 10).block_until_ready()
  t = time.perf_counter()
  spin(x, 100).block_until_ready()
  per_iteration = (time.perf_counter() - t) / 100
  return spin, max(10, int(seconds / per_iteration))


class StepWatch:
  """Wraps the real train step: knows which step the loop is in, and, with
  `busy_s`, makes each step's program compute about that much longer (data
  dependent matmuls inside the same program, whose result its metrics
  depend on): a loop that waits for a step before dispatching the next
  finds it done at the next dispatch; one that does not, still running."""

  def __init__(self, monkeypatch, busy_s=0.0):
    self.step = None  # the step last dispatched (None before the first)
    self.ready_at_next_dispatch = {}  # step -> its outputs were ready when the next came
    self._previous = None
    make = train_step.make_train_step
    spin, n = busy_loop(busy_s) if busy_s else (None, 0)

    def patched(*args, **kwargs):
      real_step = make(*args, **kwargs)

      @functools.partial(jax.jit, donate_argnums=(0, 1))
      def busy_step(state, memory, batch):
        state, memory, metrics = real_step(state, memory, batch)
        extra = spin(jnp.eye(256, dtype=jnp.float32) * metrics["nats"][0], n).sum() * 0
        return (
          state,
          memory,
          {k: v + extra.astype(v.dtype) if v.dtype != jnp.bool_ else v for k, v in metrics.items()},
        )

      def wrapped(state, memory, batch):
        if self._previous is not None:
          step, metrics = self._previous
          self.ready_at_next_dispatch[step] = all(x.is_ready() for x in metrics.values())
        self.step = 1 if self.step is None else self.step + 1
        state, memory, metrics = (busy_step if n else real_step)(state, memory, batch)
        self._previous = (self.step, metrics)
        return state, memory, metrics

      return wrapped

    monkeypatch.setattr(train_step, "make_train_step", patched)


@pytest.mark.slow
def test_the_next_step_is_dispatched_while_the_last_one_computes(tmp_path, monkeypatch):
  # Each step computes about a second longer than the host needs between
  # two dispatches, so only waiting would find it done.
  watch = StepWatch(monkeypatch, busy_s=1.0)
  train_lib.train_and_evaluate(to_train(config()), str(tmp_path))
  ordinary = [s for s in range(1, STEPS) if not due(s)]
  assert ordinary == [1, 2, 3, 5, 7, 9, 10, 11]
  assert [s for s in ordinary if watch.ready_at_next_dispatch[s]] == []


@pytest.mark.slow
def test_an_ordinary_step_reads_nothing_from_the_device(tmp_path, monkeypatch):
  # Every read of a device array's value (np.asarray, bool, float,
  # jax.device_get: all go through ArrayImpl._value) and every wait
  # (block_until_ready) is recorded with the step the loop is in.
  watch = StepWatch(monkeypatch)
  reads, waits = [], []
  value = array_lib.ArrayImpl._value

  def recorded(self):
    if threading.current_thread() is threading.main_thread():
      reads.append(watch.step)
    return value.fget(self)

  def wait(self):
    waits.append(watch.step)
    return real_wait(self)

  real_wait = array_lib.ArrayImpl.block_until_ready
  real_block = jax.block_until_ready
  monkeypatch.setattr(array_lib.ArrayImpl, "_value", property(recorded))
  monkeypatch.setattr(array_lib.ArrayImpl, "block_until_ready", wait)
  monkeypatch.setattr(
    jax, "block_until_ready", lambda x: (waits.append(watch.step), real_block(x))[1]
  )
  train_lib.train_and_evaluate(to_train(config()), str(tmp_path))
  in_steps = {s for s in reads + waits if s is not None}
  assert in_steps and all(due(s) for s in in_steps), sorted(in_steps)
  assert {4, 6, 8, 12} <= set(reads)  # the due steps do read: the check is alive


def test_one_transfer_reads_the_metric_window(monkeypatch):
  window = runlog.MetricWindow()
  metrics = [
    {
      "nats": jnp.array([1.0, 2.0]) * s,
      "tokens": jnp.array([3.0, 4.0]),
      "finite": jnp.array([True, s != 3]),
    }
    for s in range(1, 6)
  ]
  for s, m in enumerate(metrics, start=1):
    window.add(s, m)
  transfers = []
  real = jax.device_get
  monkeypatch.setattr(jax, "device_get", lambda x: (transfers.append(1), real(x))[1])
  assert window.check() == 3  # the first step with a non-finite flag
  assert len(transfers) == 1
  got = window.take()
  np.testing.assert_array_equal(got["nats"], np.stack([np.asarray(m["nats"]) for m in metrics]))
  np.testing.assert_array_equal(got["finite"][:, 1], [1, 1, 0, 1, 1])
  assert window.check() is None and len(transfers) == 1  # nothing new: no transfer


def test_the_prefetcher_runs_ahead_and_reports_what_was_consumed():
  cfg = config()
  tokenizer = data_lib.get_tokenizer(data_of(cfg.data))
  docs = data_lib.get_documents(data_of(cfg.data), "train", tokenizer)

  def steps():
    return prefetch.StepIterator(
      data_lib.SegmentIterator(
        docs, batch_size=cfg.batch_size, segment_length=cfg.model.segment_length, seed=cfg.seed
      ),
      cfg.segments_per_step,
    )

  plain = steps()
  expected = [(next(plain), plain.get_state()) for _ in range(5)]
  source = steps()
  with prefetch.Prefetcher(source, depth=6) as batches:
    for k in range(3):
      batch = next(batches)
      for name in batch:
        np.testing.assert_array_equal(batch[name], expected[k][0][name])
    deadline = time.time() + 30
    while source.get_state()["step"] < 9 * cfg.segments_per_step and time.time() < deadline:
      time.sleep(0.01)  # the thread fills its queue: 3 taken + 6 ahead
    time.sleep(0.2)
    # ... and then makes one more, which waits for room in the queue.
    made = int(source.get_state()["step"]) // cfg.segments_per_step
    assert made in (9, 10), made
    state = batches.get_state()
  for k, v in expected[2][1].items():
    np.testing.assert_array_equal(state[k], v)
  assert not [t for t in threading.enumerate() if "prefetch" in t.name]


@pytest.mark.slow
def test_a_run_resumed_from_a_prefetched_stop_equals_one_without_prefetching(tmp_path):
  straight = tmp_path / "straight"
  train_lib.train_and_evaluate(to_train(config(prefetch_steps=0)), str(straight))
  resumed = tmp_path / "resumed"
  # Stopped at step 5 with up to 8 steps' batches made ahead: the checkpoint
  # holds the position after step 5's batch, not after those.
  train_lib.train_and_evaluate(to_train(config(prefetch_steps=8)), str(resumed), stop_at_step=5)
  train_lib.train_and_evaluate(to_train(config(prefetch_steps=8)), str(resumed))
  assert_same_params(resumed, straight)
  reader = ckpt_lib.Checkpointer(str(resumed), read_only=True)
  assert reader.all_steps() == [5, 6, 12]


@pytest.mark.slow
def test_an_error_in_the_prefetcher_reaches_the_loop_and_leaves_no_thread(tmp_path, monkeypatch):
  # The tokens of a document fail to load when the prefetch thread reaches
  # it after step 7's save, as a book whose disk went away would.
  real = data_lib.TokenDocuments._load_tokens
  calls = {"n": 0}

  def failing(self, i):
    if threading.current_thread() is not threading.main_thread():
      calls["n"] += 1
      if calls["n"] > 40:
        raise DataError(f"{self.description}[{i}]: cannot read (Input/output error)")
    return real(self, i)

  monkeypatch.setattr(data_lib.TokenDocuments, "_load_tokens", failing)
  before = set(threading.enumerate())
  with pytest.raises(DataError, match=r"cannot read \(Input/output error\)"):
    train_lib.train_and_evaluate(
      to_train(config(checkpoint_every_steps=2, num_train_steps=60)), str(tmp_path)
    )
  assert set(threading.enumerate()) <= before
  saved = ckpt_lib.Checkpointer(str(tmp_path), read_only=True).all_steps()
  assert saved and not [n for n in (tmp_path / "checkpoints").iterdir() if "tmp" in n.name]
