"""On a GPU (benchmarks/accelerator.sh): bfloat16 training throughput, MFU
against the device's bf16 peak, and the peak device memory against what the
compiled step's `memory_analysis()` predicts (what aot.py reports for a
target).

    python benchmarks/accelerator.py --cases=reference,enwik8_slice

Cases: `reference` (the benchmark config of benchmarks/common.py, bf16) and
`enwik8_slice` (configs/enwik8.py's layer, 6 of its 24 layers, scanned, with
its remat policy). Prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from absl import app, flags
import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402
from compressive import aot as aot_lib  # noqa: E402
from compressive.scale import flops as flops_lib  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("cases", ["reference", "enwik8_slice"], "Which configs to run.")
flags.DEFINE_integer("rounds", 3, "Timed rounds per case.")
flags.DEFINE_integer("steps", 5, "Train steps per round.")

CASES = {
  "reference": dict(batch_size=4, model={}),
  "enwik8_slice": dict(
    batch_size=8,
    model=dict(
      vocab_size=256,
      num_layers=6,
      num_heads=8,
      d_model=1024,
      d_ff=3072,
      segment_length=768,
      memory_length=768,
      compressed_memory_length=1152,
      compression_rate=3,
      scan_layers=True,
      remat="matmuls",
    ),
  ),
}


def run_case(name: str) -> dict:
  case = CASES[name]
  config = common.reference_config(
    "ct", batch_size=case["batch_size"], dtype="bfloat16", **case["model"]
  )
  bench = common.TrainBench(config)
  compiled = bench.step_fn.lower(bench.state, bench.memory, bench.batch).compile()
  predicted = aot_lib.per_device_bytes(compiled.memory_analysis())
  rates = [bench.run(FLAGS.steps) for _ in range(FLAGS.rounds)]
  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  peak = flops_lib.device_peak_flops("bfloat16", device)
  model = common.ModelConfig.from_config(config.model)
  per_token = common.flops_per_token(model, config.batch_size).train
  rate = statistics.median(rates)
  return {
    "model": config.model.to_dict(),
    "batch_size": config.batch_size,
    "segments_per_step": config.segments_per_step,
    "parameters": bench.num_params,
    "train_tokens_per_s": rates,
    "train_tokens_per_s_median": rate,
    "train_flops_per_token": per_token,
    "mfu_vs_bf16_peak": None if peak is None else rate * per_token / peak,
    "predicted_per_device_bytes": predicted,
    "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
    "bytes_limit": stats.get("bytes_limit"),
  }


def main(argv):
  del argv
  result = {
    "device": jax.devices()[0].device_kind,
    "environment": common.environment(),
    "cases": {},
  }
  for name in FLAGS.cases:
    result["cases"][name] = run_case(name)
    print(f"{name}: {json.dumps(result['cases'][name])}", file=sys.stderr, flush=True)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
