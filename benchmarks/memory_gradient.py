"""The task-taught compression's cost: step time and memory of a windowed
train step (model.memory_gradient, gradient_window) against the paper's.

    .venv/bin/python benchmarks/memory_gradient.py
    .venv/bin/python benchmarks/memory_gradient.py --sizes=recall --rounds=5

For each size (`recall`: configs/recall.py's model, batch and the recall
study's 8 segments per step; `default`: configs/default.py's, 4 segments per
step) it compiles three train steps over the same segments per step:

  paper       gradient_window 1, model.memory_gradient none: one update per
              segment, memories stop-gradient (the paper's);
  compressor  one update per window of every segment of the step, the loss
              reaching the compression network through the compressed slots;
  memories    the same window, the loss reaching every stored slot.

It reports each step's temporaries as XLA's buffer assignment holds them
(the activations kept for the backward pass: what a window multiplies) and
its training tokens/s, the median of --rounds rounds that alternate between
the three steps so that all see the same machine. Random bytes, one
document per row starting at the step's first segment. Prints one JSON
object as its last line.
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
flags.DEFINE_integer("rounds", 3, "Alternating measurement rounds.")
flags.DEFINE_integer("train_steps", 3, "Train steps per round.")

SIZES = {"recall": (recall_config, 8), "default": (default_config, 4)}  # config, segments per step
MODES = {
  "paper": ("none", False),
  "compressor": ("compressor", True),
  "memories": ("memories", True),
}


def config_for(size: str, mode: str):
  module, segments = SIZES[size]
  config = module.get_config()
  config.data.source = "synthetic"  # the bench feeds its own random bytes
  config.segments_per_step = segments
  memory_gradient, windowed = MODES[mode]
  config.model.memory_gradient = memory_gradient
  config.gradient_window = segments if windowed else 1
  return config


def measure(size: str) -> dict:
  benches = {mode: common.TrainBench(config_for(size, mode)) for mode in MODES}
  out = {}
  for mode, bench in benches.items():
    out[mode] = {
      "compile_seconds": bench.compile(),
      "memory_bytes": bench.memory_bytes(),
      "gradient_window": bench.config.gradient_window,
      "segments_per_step": bench.config.segments_per_step,
      "tokens_per_step": bench.tokens_per_step,
      "tokens_per_second": [],
    }
  for _ in range(FLAGS.rounds):
    for mode, bench in benches.items():
      out[mode]["tokens_per_second"].append(bench.run(FLAGS.train_steps))
  for r in out.values():
    r["median_tokens_per_second"] = statistics.median(r["tokens_per_second"])
    r["step_time_vs_paper"] = (
      out["paper"]["median_tokens_per_second"] / r["median_tokens_per_second"]
    )
    r["temp_bytes_vs_paper"] = r["memory_bytes"]["temp"] / out["paper"]["memory_bytes"]["temp"]
  return out


def main(argv):
  del argv
  unknown = sorted(set(FLAGS.sizes) - set(SIZES))
  if unknown:
    raise app.UsageError(f"--sizes: unknown {unknown}; known: {', '.join(SIZES)}")
  result = {
    "environment": common.environment(),
    "sizes": {size: measure(size) for size in FLAGS.sizes},
  }
  for size, modes in result["sizes"].items():
    for mode, r in modes.items():
      print(
        f"{size:8s} {mode:10s} window {r['gradient_window']}: "
        f"{r['median_tokens_per_second']:9,.0f} tok/s ({r['step_time_vs_paper']:.2f}x the "
        f"paper's step time), temporaries {r['memory_bytes']['temp'] / 2**20:8.1f} MiB "
        f"({r['temp_bytes_vs_paper']:.2f}x)",
        file=sys.stderr,
      )
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
