"""Training and streaming-evaluation throughput, compile time, MFU and RSS.

    .venv/bin/python benchmarks/throughput.py                 # reference config, CT and TXL
    .venv/bin/python benchmarks/throughput.py --stream_tokens=100000,1000000

For each model (the Compressive Transformer of the reference config and the
Transformer-XL of the same attention span, see benchmarks/common.py) it
measures the train step's compile time, training tokens/s, streaming
evaluation tokens/s and peak RSS; rounds alternate between the models so both
see the same machine. MFU = model FLOPs per token (common.flops_per_token,
MaxText's counting) x tokens/s over the fp32 matmul GFLOP/s measured in the
same run. With --stream_tokens it instead streams one long synthetic document
through the real evaluation path (compressive.evaluation.evaluate.evaluate) and reports
peak RSS after each count. Prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("kinds", ["ct", "txl"], "Models: ct (Compressive Transformer), txl.")
flags.DEFINE_integer("rounds", 3, "Alternating measurement rounds per model.")
flags.DEFINE_integer("train_steps", 3, "Train steps per round (segments_per_step updates each).")
flags.DEFINE_integer("eval_segments", 16, "Evaluation segments per round.")
flags.DEFINE_integer("segments_per_step", 4, "Segments (updates) per jitted train step.")
flags.DEFINE_integer("batch_size", 4, "Rows.")
flags.DEFINE_string("dtype", "float32", "Activation dtype: float32 | bfloat16.")
flags.DEFINE_list("model", [], "Model overrides FIELD=VALUE (ints), e.g. d_model=256.")
flags.DEFINE_list(
  "stream_tokens",
  [],
  "Instead: stream one document through evaluation and "
  "report peak RSS after each of these token counts (ascending).",
)


def _overrides():
  out = {}
  for item in FLAGS.model:
    k, v = item.split("=", 1)
    out[k] = int(v) if v.lstrip("-").isdigit() else v
  return out


def _model_entry(config, parameters: int, compile_s: float) -> dict:
  """A model's entry in the result before its rounds: its config, size,
  compile time and FLOPs per token, and empty lists for each round's speeds."""
  flops = common.flops_per_token(common.ModelConfig.from_config(config.model), config.batch_size)
  return {
    "model": config.model.to_dict(),
    "batch_size": config.batch_size,
    "segments_per_step": config.segments_per_step,
    "parameters": parameters,
    "compile_train_step_s": compile_s,
    "train_flops_per_token": flops.train,
    "forward_flops_per_token": flops.forward,
    "eval_flops_per_token": flops.evaluate,
    "train_tokens_per_s": [],
    "eval_tokens_per_s": [],
    "eval_uncached_tokens_per_s": [],
  }


def _add_medians(entry: dict, peak: float) -> None:
  """A model's entry after its rounds: each speed's median over the rounds,
  and the share of the matmul peak (`peak` GFLOP/s) each median uses."""
  tr = statistics.median(entry["train_tokens_per_s"])
  ev = statistics.median(entry["eval_tokens_per_s"])
  entry["train_tokens_per_s_median"] = tr
  entry["eval_tokens_per_s_median"] = ev
  entry["eval_uncached_tokens_per_s_median"] = statistics.median(
    entry["eval_uncached_tokens_per_s"]
  )
  entry["train_mfu"] = tr * entry["train_flops_per_token"] / (peak * 1e9)
  entry["eval_mfu"] = ev * entry["eval_flops_per_token"] / (peak * 1e9)
  entry["eval_uncached_mfu"] = (
    entry["eval_uncached_tokens_per_s_median"] * entry["forward_flops_per_token"] / (peak * 1e9)
  )


def measure_throughput() -> dict:
  configs = {
    k: common.reference_config(
      k,
      batch_size=FLAGS.batch_size,
      dtype=FLAGS.dtype,
      segments_per_step=FLAGS.segments_per_step,
      **_overrides(),
    )
    for k in FLAGS.kinds
  }
  peak = common.matmul_gflops()
  result = {"environment": common.environment(), "matmul_gflops": {"before": peak}, "models": {}}
  benches = {}
  for kind, config in configs.items():
    tb = common.TrainBench(config)
    compile_s = tb.compile()
    eb = common.EvalBench(config)
    # The same evaluation recomputing every memory slot's keys and values
    # each segment, to show what evaluation's key/value cache buys.
    eb_plain = common.EvalBench(config, cache_keys_values=False)
    benches[kind] = (tb, eb, eb_plain)
    result["models"][kind] = _model_entry(config, tb.num_params, compile_s)
    print(f"{kind}: compiled the train step in {compile_s:.1f} s", file=sys.stderr)
  for r in range(FLAGS.rounds):
    for kind, (tb, eb, eb_plain) in benches.items():
      entry = result["models"][kind]
      tr = tb.run(FLAGS.train_steps)
      ev = eb.run(FLAGS.eval_segments)
      ev_plain = eb_plain.run(FLAGS.eval_segments)
      entry["train_tokens_per_s"].append(tr)
      entry["eval_tokens_per_s"].append(ev)
      entry["eval_uncached_tokens_per_s"].append(ev_plain)
      print(
        f"round {r} {kind}: train {tr:.0f} tok/s, eval {ev:.0f} tok/s "
        f"({ev_plain:.0f} without the key/value cache)",
        file=sys.stderr,
      )
  after = common.matmul_gflops()
  result["matmul_gflops"]["after"] = after
  peak = max(peak, after)
  result["matmul_gflops"]["peak"] = peak
  for entry in result["models"].values():
    _add_medians(entry, peak)
  result["peak_rss_mib"] = common.peak_rss_mib()
  if "ct" in benches and "txl" in benches:
    m = result["models"]
    result["ct_cost_over_txl"] = {
      "train": m["txl"]["train_tokens_per_s_median"] / m["ct"]["train_tokens_per_s_median"] - 1,
      "eval": m["txl"]["eval_tokens_per_s_median"] / m["ct"]["eval_tokens_per_s_median"] - 1,
    }
  return result


def _one_document(config, length: int):
  """The test split of the config's data made one synthetic document of
  `length` tokens (the config's data section is changed to say so)."""
  from compressive import data as data_lib

  d = config.data
  d.source = "synthetic"
  d.synthetic.num_docs = (1, 1, 1)
  d.synthetic.min_length = d.synthetic.max_length = length
  return data_lib.get_documents(d, "test", data_lib.get_tokenizer(d))


def measure_stream() -> dict:
  """Peak RSS while one long document streams through eval_lib.evaluate."""
  from compressive import config as config_lib
  from compressive.evaluation import evaluate as eval_lib
  from compressive.model.transformer import merge_params
  from compressive.training import step as train_step

  counts = sorted(int(x) for x in FLAGS.stream_tokens)
  kind = FLAGS.kinds[0]
  config = common.reference_config(kind, batch_size=1, dtype=FLAGS.dtype, **_overrides())
  config.eval.batch_size = 1
  documents = _one_document(config, counts[-1] + config.model.segment_length + 1)
  graphdef, template, params = train_step.build_model(
    common.ModelConfig.from_config(config.model), config.seed
  )
  model = merge_params(graphdef, template, params)
  t = config.model.segment_length
  experiment = config_lib.check(config, training=False)
  points = []
  for n in counts:
    start = time.perf_counter()
    out = eval_lib.evaluate(model, documents, experiment, max_segments=n // t)
    seconds = time.perf_counter() - start
    points.append(
      {
        "tokens": out["tokens"],
        "peak_rss_mib": common.peak_rss_mib(),
        "rss_mib": common.rss_mib(),
        "tokens_per_s": out["tokens"] / seconds,
      }
    )
    print(
      f"{out['tokens']:.0f} tokens: peak RSS {points[-1]['peak_rss_mib']:.0f} MiB, "
      f"{points[-1]['tokens_per_s']:.0f} tok/s",
      file=sys.stderr,
    )
  return {
    "environment": common.environment(),
    "kind": kind,
    "model": config.model.to_dict(),
    "stream": points,
    "peak_rss_growth": points[-1]["peak_rss_mib"] / points[0]["peak_rss_mib"] - 1,
  }


def main(argv):
  del argv
  result = measure_stream() if FLAGS.stream_tokens else measure_throughput()
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
