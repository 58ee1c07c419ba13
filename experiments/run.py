"""The experiments of docs/RESULTS.md, one command each.

    .venv/bin/python experiments/run.py --experiment=ct_vs_txl
    .venv/bin/python experiments/run.py --experiment=recall_study [--settings=base,...]
    .venv/bin/python experiments/run.py --experiment=books_reach [--taught]
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
           window), docs/results/books_reach_taught.json.
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
import sys

from absl import app
from absl import flags

from compressive import cli
from compressive.errors import ConfigError

if __package__:  # imported as experiments.run (the tests)
  from experiments.children import Child, evaluate, run_tool, train, write_json
else:  # run as a script: its own folder is on sys.path
  from children import Child, evaluate, run_tool, train, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_enum("experiment", None,
                  ["ct_vs_txl", "recall_study", "books_reach", "ablation", "positions"],
                  "Which experiment.")
flags.DEFINE_string("root", "runs/experiments", "Where runs and results go.")
flags.DEFINE_integer("equal_time_steps", None,
                     "Steps of the equal-wall-time Transformer-XL run; default from the "
                     "two equal-step runs' measured training throughput.")
flags.DEFINE_integer("ablation_steps", 100, "Train steps per ablation run.")
flags.DEFINE_integer("ablation_eval_segments", 100, "Test segments per row in the ablation.")
flags.DEFINE_list("settings", None, "recall_study: the settings to run (default all).")
flags.DEFINE_bool("taught", False,
                  "books_reach: with the task-taught compression (one update per step's "
                  "4 segments, model.memory_gradient=compressor; the Transformer-XL with the "
                  "same window). Writes books_reach_taught.json.")
flags.DEFINE_string("results_dir", "docs/results",
                    "recall_study, books_reach: where their results JSON goes.")
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


def recall_analysis(workdir: str, flags_: list[str] | tuple[str, ...] = ()) -> dict:
  """analyze.py --analysis=recall on the test split; reuses an earlier run's output."""
  suffix = "".join("_" + f[2:].replace("=", "") for f in flags_)
  cached = f"{workdir}/analysis_recall_test{suffix}.json"
  if os.path.exists(cached):
    return json.load(open(cached))
  return json.loads(run_tool(["analyze.py", f"--workdir={workdir}", "--analysis=recall",
                          "--split=test", *flags_]).strip().splitlines()[-1])


# The recall study: configs/recall.py (Compressive Transformer) against
# configs/recall_txl.py (Transformer-XL, memory = CT memory + compressed
# memory: equal attention cost), one thing changed at a time.
# name -> (what changes, overrides of both models, overrides of the CT only)
_REQUERY = ("--config.data.recall.requery_distances=(56,64,72)",
            "--config.data.recall.facts=32")
_MOST_USED = ("--config.model.compression=most_used",)
RECALL_STUDY = {
    "base": ("configs/recall.py as it is: rate 4, conv, attention loss, 600 steps", (), ()),
    "post_norm": ("post-norm layers (the paper's, and the default experiment's)",
                  ("--config.model.norm=post",), ()),
    "rate2": ("compression rate 2 (compressed reach 128, not 256)", (),
              ("--config.model.compression_rate=2",)),
    "steps_x2": ("2x the training steps (1,200)", ("--config.num_train_steps=1200",), ()),
    "most_used": ("most-used selection (keeps 1 in 4 evicted slots verbatim)", (), _MOST_USED),
    "autoencoding": ("the auto-encoding loss for the conv", (),
                     ("--config.model.reconstruction_loss=autoencoding",)),
    "wide": ("a wider model: d_model 256, d_ff 1024",
             ("--config.model.d_model=256", "--config.model.d_ff=1024"), ()),
    "requery": ("each fact queried twice: at 56-72 bytes, then at 24-344 bytes after that "
                "query (32 facts per document, so the events' density is unchanged)",
                _REQUERY, ()),
    # The requery setting's three near distances taught both models a
    # positional shortcut (docs/RESULTS.md §2); here the first query is at one
    # of 13 distances, 24-120 bytes, so that finding the fact takes its key.
    "most_used_requery": ("most-used selection, and each fact queried twice: at 24-120 bytes "
                          "(13 distances), then at 24-344 bytes after that query "
                          "(32 facts per document)",
                          ("--config.data.recall.requery_distances=" + str(tuple(range(24, 121, 8)))
                           .replace(" ", ""), "--config.data.recall.facts=32"), _MOST_USED),
}
# The task-taught compression (model.memory_gradient, beyond the paper): one
# update per window of 8 segments (512 bytes). A fact is compressed in the
# segment after its own, and queried 264-344 bytes (4-6 segments) later, so
# 3 to 5 of every 8 such pairs fall in one window. 8 segments per step and
# 300 steps read the bytes `base` reads, in 300 updates of 8 segments (base:
# 2,400 of one). Each Transformer-XL gets the same window and data; where
# the memories keep their gradient, its memories do too (equal cost, equal
# training signal).
_WINDOW = ("--config.segments_per_step=8", "--config.gradient_window=8",
           "--config.num_train_steps=300")
RECALL_STUDY.update({
    "taught": ("task-taught compression: the LM loss of the next 7 segments reaches the conv "
               "through the compressed memory (model.memory_gradient=compressor, "
               "gradient_window=8, 8 segments per step), beside its attention-reconstruction "
               "loss; the Transformer-XL with the same window and data",
               _WINDOW, ("--config.model.memory_gradient=compressor",)),
    # `taught` with more than three times its updates: 1,000 windows of 8
    # segments, 3.3 times `base`'s bytes (docs/RESULTS.md §2: 300 updates
    # learned no retrieval at all, at any distance).
    "taught_long": ("task-taught compression as in `taught`, with 1,000 updates of 8 segments "
                    "(3.3x base's bytes); the Transformer-XL the same",
                    _WINDOW[:2] + ("--config.num_train_steps=1000",),
                    ("--config.model.memory_gradient=compressor",)),
    "taught_memories": ("task-taught memories: the LM loss of the next 7 segments reaches every "
                        "stored slot, the conv and the layers that wrote them "
                        "(model.memory_gradient=memories, gradient_window=8), both models",
                        _WINDOW + ("--config.model.memory_gradient=memories",), ()),
})
CHANCE = {"answer_byte": 0.1, "whole_answer": 1e-4}


def beyond(acc: dict, reach: int) -> dict:
  """Pooled accuracy over the distances > reach of an analyze.py recall result."""
  sel = [i for i, d in enumerate(acc["distance"]) if d > reach]
  n = sum(acc["queries"][i] for i in sel)
  if not n:
    return {"queries": 0, "answer_byte_accuracy": None, "whole_answer_accuracy": None}
  pooled = lambda key: sum(acc[key][i] * acc["queries"][i] for i in sel) / n
  return {"queries": n, "answer_byte_accuracy": pooled("byte_accuracy"),
          "whole_answer_accuracy": pooled("exact_match")}


def _slug(overrides) -> str:
  return "_".join(o[len("--config."):].translate(str.maketrans(".,", "__", "=()"))
                  for o in overrides) or "base"


def recall_setting(out: str, name: str) -> dict:
  what, both, ct_only = RECALL_STUDY[name]
  ct_dir, txl_dir = f"{out}/{name}/ct", f"{out}/txl/{_slug(both)}"
  runs = {"ct": (train(ct_dir, "configs/recall.py", *both, *ct_only), ct_dir, []),
          "txl": (train(txl_dir, "configs/recall_txl.py", *both), txl_dir, [])}
  # The same trained CT evaluated with its compressed memory removed: what
  # recall the compressed slots carry.
  runs["ct_no_compressed"] = (runs["ct"][0], ct_dir, ["--compressed_memory_length=0"])
  with open(f"{ct_dir}/config.json") as f:
    ct = json.load(f)
  with open(f"{txl_dir}/config.json") as f:
    txl = json.load(f)
  m, mt = ct["model"], txl["model"]
  assert mt["memory_length"] == m["memory_length"] + m["compressed_memory_length"], "equal cost"
  # The Transformer-XL's whole reach, as the issue states it: layers x memory.
  # Its one hop reaches memory + segment position (< memory + segment).
  txl_reach = mt["num_layers"] * mt["memory_length"]
  txl_one_hop = mt["memory_length"] + mt["segment_length"]
  result = {"config": {
      "what": what, "ct_overrides": list(both + ct_only), "txl_overrides": list(both),
      "ct_workdir": os.path.relpath(ct_dir, ROOT), "txl_workdir": os.path.relpath(txl_dir, ROOT),
      "num_layers": m["num_layers"], "d_model": m["d_model"], "segment_length": m["segment_length"],
      "memory_length": m["memory_length"],
      "compressed_memory_length": m["compressed_memory_length"],
      "compression_rate": m["compression_rate"], "compression": m["compression"],
      "reconstruction_loss": m["reconstruction_loss"], "txl_memory_length": mt["memory_length"],
      "steps": ct["num_train_steps"], "requery_distances": list(
          ct["data"]["recall"].get("requery_distances", ())),
      "txl_reach": txl_reach, "txl_one_hop_reach": txl_one_hop,
      "ct_one_hop_reach": m["memory_length"] + m["compression_rate"] * m["compressed_memory_length"]
                          + m["segment_length"],
      "chance": CHANCE, "gradient_window": ct.get("gradient_window", 1),
      "memory_gradient": m.get("memory_gradient", "none"),
      "txl_gradient_window": txl.get("gradient_window", 1),
      "txl_memory_gradient": mt.get("memory_gradient", "none"),
      # Both models' complete configs, as their workdirs' config.json hold them.
      "ct_config": ct, "txl_config": txl}}
  for model, (summary, workdir, flags_) in runs.items():
    acc = recall_analysis(workdir, flags_)
    far, mid = beyond(acc, txl_reach), beyond(acc, txl_one_hop)
    result[model] = {
        "steps": summary["steps"], "train_seconds": summary["train_seconds"],
        "whole_answer_accuracy_beyond_txl_reach": far["whole_answer_accuracy"],
        "answer_byte_accuracy_beyond_txl_reach": far["answer_byte_accuracy"],
        "queries_beyond_txl_reach": far["queries"],
        "whole_answer_accuracy_beyond_txl_one_hop": mid["whole_answer_accuracy"],
        "answer_byte_accuracy_beyond_txl_one_hop": mid["answer_byte_accuracy"],
        "queries_beyond_txl_one_hop": mid["queries"],
        "by_distance": acc}
  return result


def plot_recall_study(name: str, r: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(8, 4.5))
  labels = {"ct": "Compressive Transformer", "txl": "Transformer-XL (equal attention cost)",
            "ct_no_compressed": "Compressive Transformer, compressed memory removed"}
  for model, label in labels.items():
    acc = r[model]["by_distance"]
    line, = ax.plot(acc["distance"], acc["exact_match"], marker="o", label=f"{label}: whole answers")
    ax.plot(acc["distance"], acc["byte_accuracy"], marker=".", ls="--", color=line.get_color(),
            label=f"{label}: answer bytes")
  c = r["config"]
  ax.axvline(c["txl_reach"], color="gray", ls=":", label=f"Transformer-XL's reach, layers x memory ({c['txl_reach']})")
  ax.axhline(0.1, color="gray", lw=0.8)
  ax.set_xlabel("bytes from the latest occurrence of the value to its query")
  ax.set_ylabel("accuracy on the test split (chance: 0.1 per byte)")
  ax.set_title(f"recall study, setting '{name}': {c['what']}", fontsize=8)
  ax.set_ylim(0, 1)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def study_table(study: dict) -> str:
  """The study as the markdown table of docs/RESULTS.md (every figure from the JSON)."""
  pct = lambda v, digits=1: "n/a" if v is None else f"{100 * v:.{digits}f}%"
  rows = ["| setting | steps | CT whole answers / answer bytes | TXL | CT, compressed memory "
          "removed | queries |", "|---|---|---|---|---|---|"]
  for name, r in study["settings"].items():
    cells = [f"{pct(r[m]['whole_answer_accuracy_beyond_txl_reach'], 2)} / "
             f"{pct(r[m]['answer_byte_accuracy_beyond_txl_reach'])}"
             for m in ("ct", "txl", "ct_no_compressed")]
    rows.append(f"| `{name}`: {r['config']['what']} | {r['config']['steps']} | "
                + " | ".join(cells) + f" | {r['ct']['queries_beyond_txl_reach']:,} |")
  return "\n".join(rows)


def recall_study(out: str) -> dict:
  names = FLAGS.settings or list(RECALL_STUDY)
  path = os.path.join(ROOT, FLAGS.results_dir, "recall_study.json")
  load = lambda: json.load(open(path)) if os.path.exists(path) else {"settings": {}}
  for name in names:
    r = recall_setting(out, name)
    # Read again just before writing: settings may run as concurrent commands.
    study = load()
    study["settings"][name] = r
    write_json(path, study)  # after each setting: an interrupted study keeps what it measured
  study = load()
  best = max(study["settings"], key=lambda n: (
      study["settings"][n]["ct"]["whole_answer_accuracy_beyond_txl_reach"] or 0.0,
      study["settings"][n]["ct"]["answer_byte_accuracy_beyond_txl_reach"] or 0.0))
  study["best"] = best
  write_json(path, study)
  plot_recall_study(best, study["settings"][best],
                    os.path.join(ROOT, "docs", "figures", "recall_study.png"))
  print(study_table(study), file=sys.stderr)
  return study


# Books: a compressed reach several times the Transformer-XL's at equal
# attention cost (memory 64 + compressed 128 = the TXL's 192 slots).
BOOKS_CT = ("--config.model.memory_length=64", "--config.model.compressed_memory_length=128",
            "--config.model.compression_rate=4")


def loss_past(workdir: str, reach: int) -> dict:
  """Test bits per byte before and past `reach` bytes into each book."""
  cached = f"{workdir}/analysis_loss_by_position_test_{reach}.json"
  if os.path.exists(cached):
    r = json.load(open(cached))
  else:
    r = json.loads(run_tool(["analyze.py", f"--workdir={workdir}", "--analysis=loss_by_position",
                         "--split=test", f"--bucket_tokens={reach}"]).strip().splitlines()[-1])
    write_json(cached, r)
  mean = lambda ks: sum(r["bits"][k] * r["tokens"][k] for k in ks) / sum(r["tokens"][k] for k in ks)
  past = [k for k, start in enumerate(r["start"]) if start >= reach]
  return {"bits_per_byte": mean(range(len(r["start"]))),
          "bits_per_byte_before_txl_reach": mean([k for k in range(len(r["start"])) if k not in past]),
          "bits_per_byte_past_txl_reach": mean(past),
          "tokens_past_txl_reach": sum(r["tokens"][k] for k in past), "by_position": r}


# The task-taught compression on books (--taught): one update per window of
# the step's 4 segments (512 bytes), both models; the CT's loss reaches its
# compression network through the compressed memory.
BOOKS_WINDOW = ("--config.gradient_window=4",)
BOOKS_TAUGHT_CT = BOOKS_WINDOW + ("--config.model.memory_gradient=compressor",)


def books_reach(out: str) -> dict:
  ct_overrides = BOOKS_CT + (BOOKS_TAUGHT_CT if FLAGS.taught else ())
  txl_overrides = BOOKS_WINDOW if FLAGS.taught else ()
  if FLAGS.taught:
    out = f"{out}_taught"
  runs = {"ct": train(f"{out}/ct", "configs/default.py", *ct_overrides),
          "txl": train(f"{out}/txl", "configs/default_txl.py", *txl_overrides)}
  steps = FLAGS.equal_time_steps or round(
      runs["ct"]["train_seconds"] / runs["txl"]["train_seconds"] * runs["txl"]["steps"])
  runs["txl_equal_time"] = train(f"{out}/txl_equal_time", "configs/default_txl.py",
                                 *txl_overrides, f"--config.num_train_steps={steps}")
  with open(f"{out}/txl/config.json") as f:
    mt = json.load(f)["model"]
  with open(f"{out}/ct/config.json") as f:
    m = json.load(f)["model"]
  reach = mt["num_layers"] * mt["memory_length"]
  result = {"config": {
      "ct_overrides": list(ct_overrides), "txl_overrides": list(txl_overrides),
      "txl_memory_length": mt["memory_length"],
      "txl_reach": reach, "ct_reach": m["num_layers"] * (
          m["memory_length"] + m["compression_rate"] * m["compressed_memory_length"]),
      "equal_time_steps": steps}}
  for name, s in runs.items():
    result[name] = {k: s[k] for k in ("steps", "train_seconds", "tokens_per_second")}
    result[name].update(loss_past(f"{out}/{name}", reach))
  name = "books_reach_taught.json" if FLAGS.taught else "books_reach.json"
  write_json(os.path.join(ROOT, FLAGS.results_dir, name), result)
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
    result = {"ct_vs_txl": ct_vs_txl, "recall_study": recall_study,
              "books_reach": books_reach, "ablation": ablation,
              "positions": positions}[FLAGS.experiment](out)
    write_json(os.path.join(out, "results.json"), result)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
