"""Can one host make training input as fast as the accelerator presets use it?

    .venv/bin/python benchmarks/input_pipeline.py                        # every row, ~11 min
    .venv/bin/python benchmarks/input_pipeline.py --steps=10 --rows=gpu8:pg19

For each preset x paper experiment of the table of docs/SCALING.md §Before renting
the hardware (the rows of docs/results/aot_table.json, which give each
row's step time at 40% MFU and its number of host processes), this builds
ONE host's share of the training input, as train.py would on that host: the
preset's config, its global batch B, segments per step S and segment length
T, a SegmentIterator over global rows [0, B / hosts) and prefetch.StepIterator
stacking S segments of every row into one step's [S, b, T] batch (numpy; no
device transfer, `put=None`). Then it measures, over --steps steps after a
first one that is reported apart (it tokenizes the first document of every
row at once):

1. making: the time of each StepIterator `next()` in the calling thread,
   including the tokenization of every document a row reaches in that step;
2. waiting: a fresh iterator run through prefetch.Prefetcher at the
   config's depth (prefetch_steps, 2) as training runs it, while the main
   thread stands in for the device by sleeping the row's 40%-MFU step time
   after each `next()`; the time each `next()` blocked is the time the
   device would have stood idle for input. How far each sleep overran is
   reported too (`sleep_overrun_ms`): the input thread holding the GIL
   (SentencePiece returns a Python list of ids) or the cores would delay
   training's next dispatch without showing as a wait.

The target: the main thread waits at most 1% of the 40%-MFU step ON AVERAGE
(mean wait / step time <= 0.01); p50, p99 and the largest wait are reported
beside it, as fractions of the step too, since a rare long wait (many rows
reaching new books in one step) is what the mean hides.

Data, with nothing downloaded beyond the project's `books` corpus:
- PG-19 rows read PG-19-sized books made from that corpus and a 32k
  SentencePiece model trained on them (benchmarks/pg19_books.py, cached in
  <cache_dir>/pg19_books/), through the `text_files` source. It stands in
  for TFDS's PG-19 reader: both hand TextDocuments one book's text at a
  time (read from a file here, from an ArrayRecord record there), and the
  cost per step is the tokenization of the books rows reach (SentencePiece,
  the same vocabulary size) and the slicing of their tokens, which are the
  same. The stand-in has 120 books where PG-19's train split
  has 28,602: a row would come back to a book within a few hundred steps and
  find its tokens in the documents' LRU cache (data.cache_tokens, 2^26
  tokens, about 600 PG-19 books), which in a PG-19 run holds a book again
  only an epoch later. So these rows run with data.cache_tokens=0: every
  book a row reaches is read and tokenized, as on PG-19.
- enwik8 rows read a stand-in file of 10^8 bytes (the corpus's texts
  repeated; <cache_dir>/enwik8/enwik8.zip, stored uncompressed) through the
  `enwik8` source with its default split (90 MB of train cut into 128
  shards): bytes are tokens, so a row's work is slicing its shard, the same
  for any content.

Prints one JSON object as its last line: per row the statistics above (in
milliseconds), the documents loaded and their cost, tokens per step, the
tokenizer, and the load average before and after. Not part of the package,
not run by CI.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import re
import shlex
import sys
import threading
import time
import zipfile

from absl import app, flags
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import pg19_books  # noqa: E402
from compressive import data, files  # noqa: E402
from compressive.data import documents as documents_lib  # noqa: E402
from compressive.data import prefetch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_integer(
  "steps",
  200,
  "Measured steps per row and phase (after the first); a "
  "PG-19-sized book lasts a row 27-80 steps, so at least ~100 to see rows "
  "reach new books.",
)
flags.DEFINE_list("rows", [], "Rows of the AOT table to run (default all), e.g. gpu8:pg19.")
flags.DEFINE_string(
  "cache_dir", "", "Folder of the stand-in corpora ('' = ~/.cache/compressive/bench)."
)
flags.DEFINE_string(
  "aot_table",
  os.path.join(ROOT, "docs", "results", "aot_table.json"),
  "The rows: preset command, host processes, step time at 40% MFU.",
)

ENWIK8_BYTES = 100_000_000
TARGET_WAIT_FRACTION = 0.01  # of the 40%-MFU step, on average


# -- The enwik8 stand-in. --------------------------------------------------------


def enwik8_standin(cache_dir: str) -> str:
  """<cache_dir>/enwik8/enwik8.zip: 10^8 bytes of the books corpus's texts,
  repeated, stored (not compressed) under the member name enwik8, as the
  presets' documented enwik8.zip is read (whole, into memory)."""
  path = os.path.join(cache_dir, "enwik8", "enwik8.zip")
  if os.path.isfile(path):
    try:
      with zipfile.ZipFile(path) as z:
        if z.getinfo("enwik8").file_size == ENWIK8_BYTES:
          return path
    except (zipfile.BadZipFile, KeyError):
      pass
  texts = data.iter_texts(data.default_data_config(), "train", seed=0)
  corpus = "\n".join(texts).encode("utf-8")
  raw = (corpus * (ENWIK8_BYTES // len(corpus) + 1))[:ENWIK8_BYTES]
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with (
    files.replacing(path, binary=True) as f,
    zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as z,
  ):
    z.writestr("enwik8", raw)
  return path


# -- Rows and their configs. -----------------------------------------------------


def load_rows(path: str, names: list[str]) -> list[dict]:
  with open(path) as f:
    rows = {r["row"]: r for r in json.load(f)}
  unknown = [n for n in names if n not in rows]
  if unknown:
    raise SystemExit(f"error: unknown rows {unknown}; choose from {list(rows)}")
  return [rows[n] for n in (names or rows)]


def config_spec(command: str) -> str:
  """`configs/gpu8.py:pg19` of an AOT row's command."""
  match = re.search(r"--config=(\S+)", command)
  if not match:
    raise SystemExit(f"error: no --config in {command!r}")
  return match.group(1)


def preset_config(spec: str) -> ml_collections.ConfigDict:
  """The config `configs/<preset>.py:<experiment>` as the config flag builds
  it: the preset's get_config(experiment)."""
  file, _, experiment = spec.partition(":")
  name = os.path.splitext(os.path.basename(file))[0]
  module = importlib.import_module(f"compressive.configs.{name}")
  return module.get_config(experiment) if experiment else module.get_config()


class TimedDocuments(documents_lib.Documents):
  """`docs` as they are, recording what each document's tokens cost to load
  (read, decode, tokenize): the work a row does when it reaches a document."""

  def __init__(self, docs: documents_lib.Documents):
    super().__init__(docs.description)
    self._docs = docs
    self.loads: list[tuple[float, int, int]] = []  # (seconds, tokens, bytes) per load
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._docs)

  def name(self, i: int) -> str:
    return self._docs.name(i)

  def _load_tokens(self, i: int) -> np.ndarray:
    raise NotImplementedError  # tokens() is overridden: the inner docs check lengths

  def tokens(self, i: int) -> np.ndarray:
    start = time.perf_counter()
    ids = self._docs.tokens(i)
    seconds = time.perf_counter() - start
    with self._lock:
      self.loads.append((seconds, len(ids), self._docs.num_bytes(i)))
    return ids

  def num_tokens(self, i: int) -> int:
    return self._docs.num_tokens(i)

  def num_words(self, i: int) -> int:
    return self._docs.num_words(i)

  def num_bytes(self, i: int) -> int:
    return self._docs.num_bytes(i)


def data_config_for(
  config: ml_collections.ConfigDict, cache_dir: str
) -> tuple[ml_collections.ConfigDict, str]:
  """The preset's data config pointed at the stand-in corpus (built on
  first use), and a line saying what it reads."""
  c = config.data
  if c.source == "pg19":
    stand_in = pg19_books.ensure(cache_dir)
    c.source = "text_files"
    c.text_files.path = stand_in.folder
    c.tokenizer = "sentencepiece"
    c.spm_model = stand_in.spm_model
    c.cache_tokens = 0  # every book reached is tokenized, as on PG-19 (module docstring)
    return c, (
      f"text_files over {stand_in.num_books} PG-19-sized books (stand-in for TFDS's "
      f"PG-19 reader; same tokenization), SentencePiece {stand_in.vocab_size} pieces, "
      "data.cache_tokens=0"
    )
  if c.source == "enwik8":
    c.enwik8.path = enwik8_standin(cache_dir)
    return c, "enwik8 source over a 10^8-byte stand-in (bytes are tokens; slicing only)"
  raise SystemExit(f"error: no stand-in for data.source={c.source!r}")


# -- Measuring. ------------------------------------------------------------------


def _ms(values) -> dict:
  v = np.asarray(values, np.float64) * 1e3
  return dict(
    mean=float(v.mean()),
    p50=float(np.percentile(v, 50)),
    p99=float(np.percentile(v, 99)),
    max=float(v.max()),
  )


def _loads(docs: TimedDocuments, first: int) -> dict:
  """Documents loaded at the first step and after it, and what those after
  it cost (ms each; MB of text per second of loading)."""
  later = docs.loads[first:]
  out = dict(first_step=first, after=len(later))
  if later:
    seconds = np.array([s for s, _, _ in later])
    tokens = np.array([t for _, t, _ in later])
    nbytes = np.array([b for _, _, b in later])
    out.update(
      ms_per_document=_ms(seconds),
      tokens_per_document=float(tokens.mean()),
      bytes_per_token=float(nbytes.sum() / tokens.sum()),
      mb_per_s=float(nbytes.sum() / seconds.sum() / 1e6),
    )
  return out


def _make_steps(step_iterator, steps: int, shape: tuple) -> tuple[list[float], dict]:
  """`steps` + 1 steps' batches made in the calling thread: the seconds each
  took, and the documents loaded (the first step's, the most in one step
  after it, and in the slowest step). `shape`: a step's inputs' shape."""
  batches, docs = step_iterator()
  make, loads_per_step = [], []
  for _ in range(steps + 1):
    before = len(docs.loads)
    begin = time.perf_counter()
    batch = next(batches)
    make.append(time.perf_counter() - begin)
    loads_per_step.append(len(docs.loads) - before)
  assert batch["inputs"].shape == shape, batch["inputs"].shape
  make_loads = _loads(docs, loads_per_step[0])
  make_loads["max_in_one_step"] = max(loads_per_step[1:], default=0)
  slowest = 1 + int(np.argmax(make[1:]))
  make_loads["in_slowest_step"] = loads_per_step[slowest]
  return make, make_loads


def _wait_steps(
  step_iterator, steps: int, depth: int, step_s: float, rows: int
) -> tuple[list[float], list[float], dict]:
  """`steps` + 1 steps waited for through the prefetcher, the device
  simulated by a sleep of `step_s`: each wait, how far each sleep overran
  (module docstring), and the documents loaded."""
  step_batches, docs = step_iterator()
  wait, overrun = [], []
  with prefetch.Prefetcher(step_batches, depth) as prefetched:
    for _ in range(steps + 1):
      begin = time.perf_counter()
      next(prefetched)
      woke = time.perf_counter()
      wait.append(woke - begin)
      time.sleep(step_s)
      overrun.append(time.perf_counter() - woke - step_s)
  # Not attributed to steps: the thread runs up to depth + 1 steps ahead.
  # Each row loads its first document at the first step.
  return wait, overrun, _loads(docs, rows)


def measure_row(row: dict, steps: int, cache_dir: str) -> dict:
  """One AOT row: `steps` steps made in the calling thread, then as many
  waited for through the prefetcher (each after a first step, reported
  apart), on a fresh iterator from the same start each time."""
  spec = config_spec(row["command"])
  config = preset_config(spec)
  data_config, source = data_config_for(config, cache_dir)
  data.validate_data_config(data_config)
  hosts = int(row.get("processes", 1))
  s, bsz, t = config.segments_per_step, config.batch_size, config.model.segment_length
  if bsz % hosts:
    raise SystemExit(f"error: {row['row']}: batch {bsz} does not split over {hosts} hosts")
  rows = bsz // hosts
  depth = int(config.get("prefetch_steps", 2))
  step_s = float(row["step_seconds_at_40pct_mfu"])
  tokenizer = data.get_tokenizer(data_config)
  start = time.perf_counter()
  inner = data.get_documents(data_config, "train", tokenizer)
  open_s = time.perf_counter() - start
  print(
    f"{row['row']}: {rows} of {bsz} rows, {s} x {t} tokens, step {step_s:.3f} s at 40% MFU",
    file=sys.stderr,
    flush=True,
  )

  def step_iterator() -> tuple[prefetch.StepIterator, TimedDocuments]:
    docs = TimedDocuments(inner)
    segments = data.SegmentIterator(
      docs,
      batch_size=bsz,
      segment_length=t,
      seed=config.seed,
      repeat=True,
      row_start=0,
      num_rows=rows,
    )
    return prefetch.StepIterator(segments, s), docs

  # 1. Making each step's batch in the calling thread.
  make, make_loads = _make_steps(step_iterator, steps, (s, rows, t))
  # 2. Waiting for it with the prefetcher, the device simulated by a sleep.
  wait, overrun, wait_loads = _wait_steps(step_iterator, steps, depth, step_s, rows)

  made, waited = _ms(make[1:]), _ms(wait[1:])
  fraction = {k: v / 1e3 / step_s for k, v in waited.items()}
  return dict(
    row=row["row"],
    config=spec,
    hosts=hosts,
    global_batch=bsz,
    rows_per_host=rows,
    segments_per_step=s,
    segment_length=t,
    tokens_per_step_per_host=s * rows * t,
    tokenizer=data_config.tokenizer,
    vocab_size=tokenizer.vocab_size,
    source=source,
    open_documents_s=open_s,
    prefetch_depth=depth,
    step_seconds_at_40pct_mfu=step_s,
    make_ms=dict(first=make[0] * 1e3, **made),
    make_fraction_of_step=dict(mean=made["mean"] / 1e3 / step_s, max=made["max"] / 1e3 / step_s),
    make_documents_loaded=make_loads,
    wait_ms=dict(first=wait[0] * 1e3, **waited),
    wait_fraction_of_step=fraction,
    waits_over_limit=int(sum(w > TARGET_WAIT_FRACTION * step_s for w in wait[1:])),
    sleep_overrun_ms=_ms(overrun[1:]),
    sleep_overrun_fraction_of_step={k: v / 1e3 / step_s for k, v in _ms(overrun[1:]).items()},
    wait_documents_loaded=wait_loads,
    target=dict(
      statistic="mean wait / step_seconds_at_40pct_mfu",
      limit=TARGET_WAIT_FRACTION,
      value=fraction["mean"],
      met=bool(fraction["mean"] <= TARGET_WAIT_FRACTION),
      max_wait_within_limit=bool(fraction["max"] <= TARGET_WAIT_FRACTION),
    ),
    load_average_after=list(os.getloadavg()),
  )


def _versions() -> dict:
  import grain
  import sentencepiece

  return dict(
    python=platform.python_version(),
    numpy=np.__version__,
    sentencepiece=sentencepiece.__version__,
    grain=getattr(grain, "__version__", "?"),
    cpu_count=os.cpu_count(),
  )


def main(argv) -> None:
  del argv
  if FLAGS.steps < 1:
    raise SystemExit("error: --steps must be >= 1")
  cache_dir = FLAGS.cache_dir or pg19_books.default_cache_dir()
  rows = load_rows(FLAGS.aot_table, FLAGS.rows)
  # The stand-ins first, so that building them (once) is not in any figure.
  if any(":pg19" in r["command"] for r in rows):
    pg19_books.ensure(cache_dir)
  if any(":enwik8" in r["command"] for r in rows):
    enwik8_standin(cache_dir)
  load_before = list(os.getloadavg())
  start = time.perf_counter()
  results = [measure_row(r, FLAGS.steps, cache_dir) for r in rows]
  result = dict(
    benchmark="input_pipeline",
    command=shlex.join([".venv/bin/python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
    steps=FLAGS.steps,
    first_step="excluded from every statistic; reported as 'first'",
    target=(
      f"main thread's mean wait for input <= {TARGET_WAIT_FRACTION:.0%} of the step at "
      "40% MFU (step_seconds_at_40pct_mfu of docs/results/aot_table.json)"
    ),
    device="simulated by sleeping the step time; put=None (no host-to-device transfer)",
    load_average=dict(before=load_before, after=list(os.getloadavg())),
    seconds=time.perf_counter() - start,
    environment=_versions(),
    all_met=all(r["target"]["met"] for r in results),
    rows=results,
  )
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
