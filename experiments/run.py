"""The experiments of docs/RESULTS.md, one command each.

    .venv/bin/python experiments/run.py --experiment=ct_vs_txl
    .venv/bin/python experiments/run.py --experiment=recall_study [--settings=base,...]
    .venv/bin/python experiments/run.py --experiment=books_reach [--taught] [--compression=NAME]
    .venv/bin/python experiments/run.py --experiment=ablation
    .venv/bin/python experiments/run.py --experiment=positions

Each trains its runs with train.py, evaluates them with eval.py / analyze.py
(as a user would), and writes results.json and PNG figures under
--root/<experiment>/. A run whose workdir already holds its final checkpoint
is not run again (an unfinished one resumes), and finished evaluations are
reused, so an interrupted experiment continues where it stopped.

ct_vs_txl  configs/default.py against configs/default_txl.py (equal attention
           cost) at equal training steps, and the Transformer-XL again with as
           many steps as fit in the Compressive Transformer's training time;
           held-out bits per byte on the whole test split.
recall_study
           configs/recall.py against configs/recall_txl.py, recalling planted
           facts (analyze.py --analysis=recall), varied one thing at a time
           (RECALL_STUDY), one command per setting (--settings):
           each setting's Compressive Transformer, its Transformer-XL of equal
           attention cost, and the Compressive Transformer evaluated with its
           compressed memory removed; accuracy beyond the Transformer-XL's
           reach. Writes docs/results/recall_study.json (settings run before
           are kept) and docs/figures/recall_study.png (the best setting).
books_reach
           books at the default size with a compressed reach several times
           the Transformer-XL's (rate 4, memory 64 + compressed 128 against
           memory 192), at equal steps and equal wall time; bits per byte on
           the parts of the test books before and past the Transformer-XL's
           reach. Writes docs/results/books_reach.json; with --taught, the
           task-taught compression (both models one update per 4-segment
           window), docs/results/books_reach_taught.json; with
           --compression=NAME, the CT compresses with NAME (both
           Transformer-XLs trained afresh beside it: the equal-time one
           takes the new CT's time), docs/results/books_reach_NAME.json.
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
import signal

from absl import app, flags

from compressive import cli
from compressive.errors import ConfigError

if __package__:  # imported as experiments.run (the tests)
  from experiments.children import Child, evaluate, run_tool, train, write_json
  from experiments.recall_study import RECALL_STUDY, recall_study
else:  # run as a script: its own folder is on sys.path
  from children import Child, evaluate, run_tool, train, write_json
  from recall_study import RECALL_STUDY, recall_study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_enum(
  "experiment",
  None,
  ["ct_vs_txl", "recall_study", "books_reach", "ablation", "positions"],
  "Which experiment.",
)
flags.DEFINE_string("root", "runs/experiments", "Where runs and results go.")
flags.DEFINE_integer(
  "equal_time_steps",
  None,
  "Steps of the equal-wall-time Transformer-XL run; default from the "
  "two equal-step runs' measured training throughput.",
)
flags.DEFINE_integer("ablation_steps", 100, "Train steps per ablation run.")
flags.DEFINE_integer("ablation_eval_segments", 100, "Test segments per row in the ablation.")
flags.DEFINE_list("settings", None, "recall_study: the settings to run (default all).")
flags.DEFINE_bool(
  "taught",
  False,
  "books_reach: with the task-taught compression (one update per step's "
  "4 segments, model.memory_gradient=compressor; the Transformer-XL with the "
  "same window). Writes books_reach_taught.json.",
)
flags.DEFINE_string(
  "compression",
  None,
  "books_reach: the CT's model.compression (default the config's, conv). "
  "Writes books_reach_<compression>.json.",
)
flags.DEFINE_string(
  "results_dir", "docs/results", "recall_study, books_reach: where their results JSON goes."
)
flags.mark_flag_as_required("experiment")

ABLATION = [  # (name, compression, reconstruction loss)
  ("max_pool", "max_pool", "attention"),
  ("mean_pool", "mean_pool", "attention"),
  ("conv", "conv", "attention"),
  ("dilated_conv", "dilated_conv", "attention"),
  ("most_used", "most_used", "attention"),
  ("conv_autoencoding", "conv", "autoencoding"),
]


def _plot_curves(runs: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

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
  runs = {
    "ct": train(f"{out}/ct", "configs/default.py"),
    "txl": train(f"{out}/txl", "configs/default_txl.py"),
  }
  steps = FLAGS.equal_time_steps or round(
    runs["ct"]["train_seconds"] / runs["txl"]["train_seconds"] * runs["txl"]["steps"]
  )
  runs["txl_equal_time"] = train(
    f"{out}/txl_equal_time", "configs/default_txl.py", f"--config.num_train_steps={steps}"
  )
  result = {}
  for name, s in runs.items():
    ev = evaluate(f"{out}/{name}")
    result[name] = {k: s[k] for k in ("steps", "train_seconds", "tokens_per_second")}
    result[name]["test_bits_per_byte"] = ev["bits_per_byte"]
  _plot_curves(runs, f"{out}/curves.png")
  return result


# Books: a compressed reach several times the Transformer-XL's at equal
# attention cost (memory 64 + compressed 128 = the TXL's 192 slots).
BOOKS_CT = (
  "--config.model.memory_length=64",
  "--config.model.compressed_memory_length=128",
  "--config.model.compression_rate=4",
)


def loss_past(workdir: str, reach: int) -> dict:
  """Test bits per byte before and past `reach` bytes into each book."""
  cached = f"{workdir}/analysis_loss_by_position_test_{reach}.json"
  if os.path.exists(cached):
    r = json.load(open(cached))
  else:
    r = json.loads(
      run_tool(
        [
          "analyze.py",
          f"--workdir={workdir}",
          "--analysis=loss_by_position",
          "--split=test",
          f"--bucket_tokens={reach}",
        ]
      )
      .strip()
      .splitlines()[-1]
    )
    write_json(cached, r)
  mean = lambda ks: sum(r["bits"][k] * r["tokens"][k] for k in ks) / sum(r["tokens"][k] for k in ks)
  past = [k for k, start in enumerate(r["start"]) if start >= reach]
  return {
    "bits_per_byte": mean(range(len(r["start"]))),
    "bits_per_byte_before_txl_reach": mean([k for k in range(len(r["start"])) if k not in past]),
    "bits_per_byte_past_txl_reach": mean(past),
    "tokens_past_txl_reach": sum(r["tokens"][k] for k in past),
    "by_position": r,
  }


# The task-taught compression on books (--taught): one update per window of
# the step's 4 segments (512 bytes), both models; the CT's loss reaches its
# compression network through the compressed memory.
BOOKS_WINDOW = ("--config.gradient_window=4",)
BOOKS_TAUGHT_CT = BOOKS_WINDOW + ("--config.model.memory_gradient=compressor",)


def books_reach(out: str) -> dict:
  ct_overrides = BOOKS_CT + (BOOKS_TAUGHT_CT if FLAGS.taught else ())
  txl_overrides = BOOKS_WINDOW if FLAGS.taught else ()
  suffix = ("_taught" if FLAGS.taught else "") + (
    f"_{FLAGS.compression}" if FLAGS.compression else ""
  )
  if FLAGS.compression:
    ct_overrides += (f"--config.model.compression={FLAGS.compression}",)
  out += suffix
  runs = {
    "ct": train(f"{out}/ct", "configs/default.py", *ct_overrides),
    "txl": train(f"{out}/txl", "configs/default_txl.py", *txl_overrides),
  }
  steps = FLAGS.equal_time_steps or round(
    runs["ct"]["train_seconds"] / runs["txl"]["train_seconds"] * runs["txl"]["steps"]
  )
  runs["txl_equal_time"] = train(
    f"{out}/txl_equal_time",
    "configs/default_txl.py",
    *txl_overrides,
    f"--config.num_train_steps={steps}",
  )
  with open(f"{out}/txl/config.json") as f:
    mt = json.load(f)["model"]
  with open(f"{out}/ct/config.json") as f:
    m = json.load(f)["model"]
  reach = mt["num_layers"] * mt["memory_length"]
  result = {
    "config": {
      "ct_overrides": list(ct_overrides),
      "txl_overrides": list(txl_overrides),
      "txl_memory_length": mt["memory_length"],
      "txl_reach": reach,
      "ct_reach": m["num_layers"]
      * (m["memory_length"] + m["compression_rate"] * m["compressed_memory_length"]),
      "equal_time_steps": steps,
    }
  }
  for name, s in runs.items():
    result[name] = {k: s[k] for k in ("steps", "train_seconds", "tokens_per_second")}
    result[name].update(loss_past(f"{out}/{name}", reach))
  name = f"books_reach{suffix}.json"
  write_json(os.path.join(ROOT, FLAGS.results_dir, name), result)
  return result


def ablation(out: str) -> dict:
  result = {}
  for name, compression, loss in ABLATION:
    s = train(
      f"{out}/{name}",
      "configs/default.py",
      f"--config.num_train_steps={FLAGS.ablation_steps}",
      f"--config.model.compression={compression}",
      f"--config.model.reconstruction_loss={loss}",
    )
    ev = evaluate(f"{out}/{name}", max_segments=FLAGS.ablation_eval_segments)
    rows = [json.loads(line) for line in open(f"{out}/{name}/metrics_train.jsonl")]
    result[name] = {
      "compression": compression,
      "loss": loss,
      "steps": s["steps"],
      "train_seconds": s["train_seconds"],
      "final_reconstruction_loss": rows[-1]["reconstruction_loss"],
      "test_bits_per_byte": ev["bits_per_byte"],
      "test_tokens": ev["tokens"],
    }
  return result


def positions(out: str) -> dict:
  runs = {
    "relative": (os.path.join(os.path.dirname(out), "ct_vs_txl", "ct"), "configs/default.py"),
    "rope": (f"{out}/rope", "configs/default_rope.py"),
  }
  result = {}
  for name, (workdir, config) in runs.items():
    s = train(workdir, config)
    ev = evaluate(workdir)
    result[name] = {
      "workdir": workdir,
      "steps": s["steps"],
      "train_seconds": s["train_seconds"],
      "tokens_per_second": s["tokens_per_second"],
      "test_bits_per_byte": ev["bits_per_byte"],
    }
  return result


def validate_flags() -> None:
  """ConfigError for a count flag out of its range, before anything runs."""
  for name in ("ablation_steps", "ablation_eval_segments", "equal_time_steps"):
    value = FLAGS[name].value
    if value is not None and value < 1:
      raise ConfigError(f"--{name}={value} must be >= 1")
  unknown = sorted(set(FLAGS.settings or ()) - set(RECALL_STUDY))
  if unknown:
    raise ConfigError(f"--settings: unknown {unknown}; known: {', '.join(RECALL_STUDY)}")


def main(argv):
  del argv  # cli.parse_flags refuses positional arguments
  signal.signal(signal.SIGTERM, Child.forward)
  signal.signal(signal.SIGINT, Child.forward)
  with cli.user_errors():
    validate_flags()
    out = os.path.join(ROOT, FLAGS.root, FLAGS.experiment)  # FLAGS.root may be absolute
    os.makedirs(out, exist_ok=True)
    study = lambda out: recall_study(out, FLAGS.settings or [], FLAGS.results_dir)
    result = {
      "ct_vs_txl": ct_vs_txl,
      "recall_study": study,
      "books_reach": books_reach,
      "ablation": ablation,
      "positions": positions,
    }[FLAGS.experiment](out)
    write_json(os.path.join(out, "results.json"), result)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
