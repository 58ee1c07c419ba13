"""What each compression function costs: train-step time and memory of the
same model with each `model.compression`, against the paper's convolution.

    .venv/bin/python benchmarks/compressions.py
    .venv/bin/python benchmarks/compressions.py --sizes=recall --rounds=5 \
        --compressions=conv,max_pool,overlap_max_pool,conv+own

For each size (`recall`: configs/recall.py's model and batch, 4 segments per
step; `default`: configs/default.py's) and each compression it compiles the
train step (attention-reconstruction loss where the compression has
parameters, none where it has not, as the model decides; NAME+own: with
`model.compressed_keys_values=own`, the compressed slots' own projections)
and reports its temporaries as XLA's buffer assignment holds them, its
compile time, and its training tokens/s: the median of --rounds rounds that
alternate between the compressions so that all see the same machine. Random
bytes, one document per row starting at the step's first segment. Prints one
JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402
from compressive.configs import default as default_config  # noqa: E402
from compressive.configs import recall as recall_config  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["recall", "default"], "recall | default.")
flags.DEFINE_list(
  "compressions",
  ["conv", "max_pool", "overlap_max_pool", "mean_pool"],
  "model.compression values (NAME+own: with model.compressed_keys_values=own); "
  "the first is the one the others are compared with.",
)
flags.DEFINE_integer("rounds", 3, "Alternating measurement rounds.")
flags.DEFINE_integer("train_steps", 3, "Train steps per round.")

SIZES = {"recall": recall_config, "default": default_config}


def config_for(size: str, compression: str):
  config = SIZES[size].get_config()
  config.data.source = "synthetic"  # the bench feeds its own random bytes
  config.segments_per_step = 4
  name, _, own = compression.partition("+")
  config.model.compression = name
  if own:
    config.model.compressed_keys_values = own
  return config


def measure(size: str) -> dict:
  benches = {c: common.TrainBench(config_for(size, c)) for c in FLAGS.compressions}
  out = {}
  for name, bench in benches.items():
    out[name] = {
      "compile_seconds": bench.compile(),
      "memory_bytes": bench.memory_bytes(),
      "tokens_per_step": bench.tokens_per_step,
      "tokens_per_second": [],
    }
  for _ in range(FLAGS.rounds):
    for name, bench in benches.items():
      out[name]["tokens_per_second"].append(bench.run(FLAGS.train_steps))
  first = out[FLAGS.compressions[0]]
  for r in out.values():
    r["median_tokens_per_second"] = statistics.median(r["tokens_per_second"])
    r["step_time_vs_first"] = first["median_tokens_per_second"] / r["median_tokens_per_second"]
    r["temp_bytes_vs_first"] = r["memory_bytes"]["temp"] / first["memory_bytes"]["temp"]
  return out


def main(argv):
  del argv
  unknown = sorted(set(FLAGS.sizes) - set(SIZES))
  if unknown:
    raise app.UsageError(f"--sizes: unknown {unknown}; known: {', '.join(SIZES)}")
  result = {
    "environment": common.environment(),
    "compared_with": FLAGS.compressions[0],
    "sizes": {size: measure(size) for size in FLAGS.sizes},
  }
  for size, rows in result["sizes"].items():
    for name, r in rows.items():
      print(
        f"{size:8s} {name:18s} {r['median_tokens_per_second']:9,.0f} tok/s "
        f"({r['step_time_vs_first']:.2f}x {FLAGS.compressions[0]}'s step time), "
        f"temporaries {r['memory_bytes']['temp'] / 2**20:8.1f} MiB "
        f"({r['temp_bytes_vs_first']:.2f}x)",
        file=sys.stderr,
      )
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
