"""The experiments of docs/RESULTS.md, one command each.

    .venv/bin/python experiments/run.py --experiment=ct_vs_txl
    .venv/bin/python experiments/run.py --experiment=recall
    .venv/bin/python experiments/run.py --experiment=ablation
    .venv/bin/python experiments/run.py --experiment=positions

Each trains its runs with train.py, evaluates them with eval.py / analyze.py
(as a user would), and writes results.json and PNG figures under
--root/<experiment>/. A run whose workdir already holds its final checkpoint
is not retrained (train.py resumes), and finished evaluations are reused, so
an interrupted experiment continues where it stopped.

ct_vs_txl  configs/default.py against configs/default_txl.py (equal attention
           cost) at equal training steps, and the Transformer-XL again with as
           many steps as fit in the Compressive Transformer's training time;
           held-out bits per byte on the whole test split.
recall     configs/recall.py against configs/recall_txl.py: accuracy of
           recalling planted facts by distance (analyze.py --analysis=recall).
positions  configs/default_rope.py (rotary positions) against the relative
           positions of configs/default.py (the ct_vs_txl run, trained here if
           missing); held-out bits per byte on the whole test split.
ablation   the default model with each compression function (attention-
           reconstruction loss) and conv with the auto-encoding loss, for
           --ablation_steps steps; bits per byte on the first
           --ablation_eval_segments segments of every test row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_enum("experiment", None, ["ct_vs_txl", "recall", "ablation", "positions"],
                  "Which experiment.")
flags.DEFINE_string("root", "runs/experiments", "Where runs and results go.")
flags.DEFINE_integer("equal_time_steps", None,
                     "Steps of the equal-wall-time Transformer-XL run; default from the "
                     "two equal-step runs' measured training throughput.")
flags.DEFINE_integer("ablation_steps", 100, "Train steps per ablation run.")
flags.DEFINE_integer("ablation_eval_segments", 100, "Test segments per row in the ablation.")
flags.mark_flag_as_required("experiment")

ABLATION = [  # (name, compression, reconstruction loss)
    ("max_pool", "max_pool", "attention"),
    ("mean_pool", "mean_pool", "attention"),
    ("conv", "conv", "attention"),
    ("dilated_conv", "dilated_conv", "attention"),
    ("most_used", "most_used", "attention"),
    ("conv_autoencoding", "conv", "autoencoding"),
]


def _run(args: list[str]) -> str:
  cmd = [sys.executable] + args
  print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
  out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
  if out.returncode:
    sys.exit(f"error: {' '.join(args[:1])} exited with {out.returncode}")
  return out.stdout


def train(workdir: str, config: str, *overrides: str) -> dict:
  """Trains (or finishes) a run; returns its training summary."""
  _run(["train.py", f"--config={config}", f"--workdir={workdir}", *overrides])
  return train_summary(workdir)


def train_summary(workdir: str) -> dict:
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics_train.jsonl"))]
  seconds, tokens = 0.0, 0
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  per_step = config["batch_size"] * config["segments_per_step"] * config["model"]["segment_length"]
  prev = 0
  curve = []
  for r in rows:
    n = (r["step"] - prev) * per_step
    seconds += n / r["tokens_per_second"]
    tokens += n
    prev = r["step"]
    curve.append((r["step"], seconds, r["bits_per_byte"]))
  return {"steps": prev, "train_seconds": seconds, "train_tokens": tokens,
          "tokens_per_second": tokens / seconds, "curve": curve}


def evaluate(workdir: str, split: str = "test", max_segments: int | None = None) -> dict:
  tag = f"_first{max_segments}" if max_segments else ""
  cached = os.path.join(workdir, f"result_{split}{tag}.json")
  if os.path.exists(cached):
    return json.load(open(cached))
  args = ["eval.py", f"--workdir={workdir}", f"--split={split}"]
  if max_segments:
    args.append(f"--max_segments={max_segments}")
  result = json.loads(_run(args).strip().splitlines()[-1])
  with open(cached, "w") as f:
    json.dump(result, f, indent=2)
  return result


def _plot_curves(runs: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for name, s in runs.items():
    steps, seconds, bpb = zip(*s["curve"])
    axes[0].plot(steps, bpb, label=name)
    axes[1].plot([x / 60 for x in seconds], bpb, label=name)
  axes[0].set_xlabel("train step")
  axes[1].set_xlabel("training time (minutes, this machine)")
  axes[0].set_ylabel("training bits per byte")
  for ax in axes:
    ax.set_ylim(top=min(4.0, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def ct_vs_txl(out: str) -> dict:
  runs = {"ct": train(f"{out}/ct", "configs/default.py"),
          "txl": train(f"{out}/txl", "configs/default_txl.py")}
  steps = FLAGS.equal_time_steps or round(
      runs["ct"]["train_seconds"] / runs["txl"]["train_seconds"] * runs["txl"]["steps"])
  runs["txl_equal_time"] = train(f"{out}/txl_equal_time", "configs/default_txl.py",
                                 f"--config.num_train_steps={steps}")
  result = {}
  for name, s in runs.items():
    ev = evaluate(f"{out}/{name}")
    result[name] = {k: s[k] for k in ("steps", "train_seconds", "tokens_per_second")}
    result[name]["test_bits_per_byte"] = ev["bits_per_byte"]
  _plot_curves(runs, f"{out}/curves.png")
  return result


def recall(out: str) -> dict:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  result = {}
  runs = (("ct", "configs/recall.py", []), ("txl", "configs/recall_txl.py", []),
          # The same trained Compressive Transformer evaluated with its
          # compressed memory removed: what retrieval the compressed slots carry.
          ("ct_without_compressed_memory", None, ["--compressed_memory_length=0"]))
  for name, config, flags_ in runs:
    workdir = f"{out}/{name}" if config else f"{out}/ct"
    s = train(workdir, config) if config else train_summary(workdir)
    suffix = "".join("_" + f[2:].replace("=", "") for f in flags_)
    cached = f"{workdir}/analysis_recall_test{suffix}.json"
    if os.path.exists(cached):  # analyze.py's output from an earlier run of this command
      acc = json.load(open(cached))
    else:
      acc = json.loads(_run(["analyze.py", f"--workdir={workdir}", "--analysis=recall",
                             "--split=test", *flags_]).strip().splitlines()[-1])
    with open(f"{workdir}/config.json") as f:
      m = json.load(f)["model"]
    span = m["memory_length"] + m["compression_rate"] * m["compressed_memory_length"]
    if flags_:
      span = m["memory_length"]
    result[name] = {"steps": s["steps"], "train_seconds": s["train_seconds"], **acc,
                    "one_hop_reach": span, "layers_reach": m["num_layers"] * span}
  fig, ax = plt.subplots(figsize=(8, 4.5))
  labels = {"ct": "Compressive Transformer", "txl": "Transformer-XL",
            "ct_without_compressed_memory": "Compressive Transformer, compressed memory removed"}
  for name, r in result.items():
    line, = ax.plot(r["distance"], r["byte_accuracy"], marker="o", label=f"{labels[name]}: answer bytes")
    ax.plot(r["distance"], r["exact_match"], marker=".", ls="--", color=line.get_color(),
            label=f"{labels[name]}: whole answers")
    if name != "ct_without_compressed_memory":
      ax.axvline(r["one_hop_reach"] + m["segment_length"], color=line.get_color(), ls=":",
                 alpha=0.7)
  ax.axhline(0.1, color="gray", lw=0.8)
  ax.set_xlabel("distance from fact to query (bytes); dotted: one-hop reach (span + segment)")
  ax.set_ylabel("accuracy on the test split (chance: 0.1 per byte)")
  ax.set_ylim(0, 1)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(f"{out}/recall.png", dpi=120)
  return result


def ablation(out: str) -> dict:
  result = {}
  for name, compression, loss in ABLATION:
    s = train(f"{out}/{name}", "configs/default.py",
              f"--config.num_train_steps={FLAGS.ablation_steps}",
              f"--config.model.compression={compression}",
              f"--config.model.reconstruction_loss={loss}")
    ev = evaluate(f"{out}/{name}", max_segments=FLAGS.ablation_eval_segments)
    rows = [json.loads(line) for line in open(f"{out}/{name}/metrics_train.jsonl")]
    result[name] = {"compression": compression, "loss": loss, "steps": s["steps"],
                    "train_seconds": s["train_seconds"],
                    "final_reconstruction_loss": rows[-1]["reconstruction_loss"],
                    "test_bits_per_byte": ev["bits_per_byte"], "test_tokens": ev["tokens"]}
  return result


def positions(out: str) -> dict:
  runs = {"relative": (os.path.join(os.path.dirname(out), "ct_vs_txl", "ct"), "configs/default.py"),
          "rope": (f"{out}/rope", "configs/default_rope.py")}
  result = {}
  for name, (workdir, config) in runs.items():
    s = train(workdir, config)
    ev = evaluate(workdir)
    result[name] = {"workdir": workdir, "steps": s["steps"], "train_seconds": s["train_seconds"],
                    "tokens_per_second": s["tokens_per_second"],
                    "test_bits_per_byte": ev["bits_per_byte"]}
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  out = os.path.join(ROOT, FLAGS.root, FLAGS.experiment)  # FLAGS.root may be absolute
  os.makedirs(out, exist_ok=True)
  result = {"ct_vs_txl": ct_vs_txl, "recall": recall, "ablation": ablation,
            "positions": positions}[FLAGS.experiment](out)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(result, f, indent=2)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
