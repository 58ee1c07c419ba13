"""The recall study of experiments/run.py (--experiment=recall_study):
configs/recall.py (Compressive Transformer) against configs/recall_txl.py
(Transformer-XL, memory = CT memory + compressed memory: equal attention
cost), one thing changed at a time (RECALL_STUDY), each setting's CT also
evaluated with its compressed memory removed; accuracy beyond the
Transformer-XL's reach (docs/RESULTS.md §2)."""

from __future__ import annotations

import json
import os
import sys

if __package__:  # imported as experiments.recall_study (the tests, run.py)
  from experiments.children import run_tool, train, train_summary, write_json
else:  # run.py run as a script: experiments/ is on sys.path
  from children import run_tool, train, train_summary, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recall_analysis(workdir: str, flags_: list[str] | tuple[str, ...] = (),
                    analysis: str = "recall") -> dict:
  """analyze.py --analysis=recall (or recall_probe) on the test split;
  reuses an earlier run's output."""
  suffix = "".join("_" + f[2:].replace("=", "") for f in flags_)
  cached = f"{workdir}/analysis_{analysis}_test{suffix}.json"
  if os.path.exists(cached):
    return json.load(open(cached))
  return json.loads(run_tool(["analyze.py", f"--workdir={workdir}", f"--analysis={analysis}",
                          "--split=test", *_plugin(workdir), *flags_]).strip().splitlines()[-1])


def _plugin(workdir: str) -> list[str]:
  """--plugin for a run whose compression is a plugin (`module:Name`): a
  saved config never imports code by itself."""
  with open(f"{workdir}/config.json") as f:
    name = json.load(f)["model"]["compression"]
  return [f"--plugin={name.split(':')[0]}"] if ":" in name else []


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
# Every compression function at the task's four-digit values and at one
# digit (the task's documents, facts, distances and cost, each value one
# digit long): which keep a fact past the Transformer-XL's reach, and which
# keep its order. `base` and `most_used` are the convolution's and most-used
# selection's four-digit settings; a one-digit setting's Transformer-XL is
# trained on the same one-digit documents.
ONE_DIGIT = ("--config.data.recall.value_len=1",)
_FUNCTIONS = {"max_pool": "max pooling", "mean_pool": "mean pooling",
              "conv": "the convolution", "dilated_conv": "the dilated convolution",
              "most_used": "most-used selection",
              "overlap_max_pool": "max pooling over overlapping windows (2c slots, stride c)"}
# Learned selections (beyond the paper; experiments/compressions.py), measured
# below the pooling they were meant to improve on.
_PLUGINS = {"attention_pool": ("learned selection (attention pooling, one head)",
                               "experiments.compressions:AttentionPool"),
            "ordered_pool": ("learned ordered selection (attention pooling, a head per "
                             "position)", "experiments.compressions:OrderedPool")}
for _fn, (_what, _path) in _PLUGINS.items():
  RECALL_STUDY[_fn] = (f"{_what} (rate 4), four-digit values", (),
                       ("--config.model.compression=" + _path,))
  RECALL_STUDY[f"{_fn}_1digit"] = (f"{_what} (rate 4), one-digit values", ONE_DIGIT,
                                   ("--config.model.compression=" + _path,))
for _fn, _what in _FUNCTIONS.items():
  _ct = ("--config.model.compression=" + _fn,) if _fn != "conv" else ()
  if _fn not in ("conv", "most_used"):
    RECALL_STUDY[_fn] = (f"{_what} (rate 4), four-digit values", (), _ct)
  RECALL_STUDY[f"{_fn}_1digit"] = (f"{_what} (rate 4), one-digit values", ONE_DIGIT, _ct)
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
# Settings that start from another setting's trained models: each model's
# workdir is a copy of that setting's, resumed with the overrides (the
# optimizer state and the data position go on; the learning rate follows
# the new num_train_steps' schedule from the step it resumes at).
# name -> the setting it starts from.
#
# The task-taught window as fine-tuning: `base` has learned to retrieve
# from its uncompressed memory in 600 steps, where `taught` from nothing
# learned no retrieval in 300 windows; here its 600 steps go on for 300
# windows of 8 segments with the LM loss reaching the conv (the
# Transformer-XL: its `base`, the same window and data).
WARM_START = {"taught_finetune": "base", "taught_memories_finetune": "base"}
RECALL_STUDY["taught_finetune"] = (
    "`base`'s models (600 steps), then 300 windows of 8 segments with the task-taught "
    "compression (model.memory_gradient=compressor, gradient_window=8); the Transformer-XL: "
    "its `base`, then the same window and data",
    _WINDOW[:2] + ("--config.num_train_steps=900",),
    ("--config.model.memory_gradient=compressor",))
RECALL_STUDY["taught_memories_finetune"] = (
    "`base`'s models (600 steps), then 300 windows of 8 segments with the task-taught "
    "memories (model.memory_gradient=memories: the LM loss of the next 7 segments reaches "
    "every stored slot, the conv and the layers that wrote them), both models",
    _WINDOW[:2] + ("--config.num_train_steps=900", "--config.model.memory_gradient=memories"),
    ())
# Wider windows, from experiments/compressions.py (not part of the package).
_OVERLAP3 = ("--config.model.compression=experiments.compressions:Overlap3MaxPool",)
RECALL_STUDY["overlap3_max_pool"] = (
    "max pooling over overlapping windows of 3c slots (stride c), four-digit values", (),
    _OVERLAP3)
RECALL_STUDY["overlap3_max_pool_1digit"] = (
    "max pooling over overlapping windows of 3c slots (stride c), one-digit values", ONE_DIGIT,
    _OVERLAP3)
# More seeds (config.seed: initialisation and data order) where a setting decides a finding.
for _name, _seed in (("max_pool_1digit", 1), ("max_pool_1digit", 2), ("conv_1digit", 1),
                     ("overlap_max_pool_1digit", 1), ("overlap_max_pool_1digit", 2),
                     ("overlap_max_pool", 1)):
  _what, _both, _ct = RECALL_STUDY[_name]
  _both += (f"--config.seed={_seed}",)
  RECALL_STUDY[f"{_name}_seed{_seed}"] = (f"{_what}; seed {_seed}", _both, _ct)

# The task's gradient where a selective compression can use it: a trained
# setting's two models go on for 300 windows of 8 segments with the loss of
# later segments reaching the compression (`_taught`: model.memory_gradient=
# compressor, the CT alone) or every stored slot (`_taught_memories`: both
# models); a checkpoint every 50 windows, each measured (the curve of
# windows against recall past the reach).
_CURVE = ("--config.checkpoint_every_steps=50", "--config.keep_checkpoints=10")
for _start in ("attention_pool_1digit", "max_pool_1digit", "ordered_pool_1digit",
               "overlap_max_pool_1digit", "ordered_pool", "attention_pool", "overlap_max_pool"):
  _, _both, _start_ct = RECALL_STUDY[_start]
  WARM_START[f"{_start}_taught"] = _start
  RECALL_STUDY[f"{_start}_taught"] = (
      f"`{_start}`'s models (600 steps), then 300 windows of 8 segments with the LM loss "
      "reaching the compression (model.memory_gradient=compressor); the Transformer-XL: its "
      "start, then the same window and data",
      _both + _WINDOW[:2] + ("--config.num_train_steps=900",) + _CURVE,
      _start_ct + ("--config.model.memory_gradient=compressor",))
  WARM_START[f"{_start}_taught_memories"] = _start
  RECALL_STUDY[f"{_start}_taught_memories"] = (
      f"`{_start}`'s models (600 steps), then 300 windows of 8 segments with the LM loss "
      "reaching every stored slot, the compression and the layers that wrote them "
      "(model.memory_gradient=memories), both models",
      _both + _WINDOW[:2] + ("--config.num_train_steps=900",
                             "--config.model.memory_gradient=memories") + _CURVE, _start_ct)
# Longer training: a setting's two models go on to 1,200 steps (the
# learning rate following a schedule to step 1,200 from the step they resume
# at), measured every 50 steps.
for _start in ("overlap_max_pool_1digit", "overlap_max_pool"):
  _, _both, _start_ct = RECALL_STUDY[_start]
  WARM_START[f"{_start}_longer"] = _start
  RECALL_STUDY[f"{_start}_longer"] = (
      f"`{_start}`'s models (600 steps) trained on to 1,200 steps, both models",
      _both + ("--config.num_train_steps=1200",) + _CURVE, _start_ct)
CURVE_SETTINGS = {n for n, (_, both, _) in RECALL_STUDY.items() if _CURVE[0] in both}
CHANCE = {"answer_byte": 0.1, "whole_answer": 1e-4}


def pooled_probe(result: dict, beyond_: int) -> dict:
  """analyze.py --analysis=recall_probe's figures pooled over the distances >
  `beyond_`, each distance weighted by its test samples: {"samples",
  "accuracy", "layers": [{"probe", "probe_control", "found", "value_weight",
  "other_weight"}]}."""
  sel = [i for i, d in enumerate(result["distance"]) if d > beyond_]
  n = [result["samples"][i] for i in sel]
  if not sum(n):
    return {"samples": 0}

  def pool(values):
    pairs = [(v, w) for v, w in zip((values[i] for i in sel), n) if v is not None]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None

  return {"samples": sum(n), "accuracy": pool(result["accuracy"]),
          "layers": [{k: pool(layer[k]) for k in ("probe", "probe_control", "found",
                                                  "value_weight", "other_weight")}
                     for layer in result["layers"]]}


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


def _setting_dirs(out: str, name: str) -> tuple[str, str]:
  """The CT's and the TXL's workdirs of a setting (TXLs are shared by the
  settings that change nothing of theirs)."""
  _, both, _ = RECALL_STUDY[name]
  start = WARM_START.get(name)
  if start:  # named by the Transformer-XL it starts from, which the CT's compression leaves alone
    txl = f"from_{os.path.basename(_setting_dirs(out, start)[1])}_{_slug(both)}"
  else:
    txl = _slug(both)
  return f"{out}/{name}/ct", f"{out}/txl/{txl}"


def _train_from(source: str, workdir: str, config: str, *overrides: str) -> dict:
  """Trains a copy of the finished run `source` on with `overrides`; returns
  the summary of both parts (steps, seconds and tokens added up)."""
  import shutil
  before = train_summary(source)
  if not os.path.exists(workdir):
    # Not its lock record nor the cached results of the source's model.
    shutil.copytree(source, workdir, ignore=shutil.ignore_patterns(
        "train.lock*", "analysis_*", "result_*"))
  steps = [o.split("=", 1)[1] for o in overrides if o.startswith("--config.num_train_steps=")]
  assert steps, "a warm start names the steps it trains to"
  # (train()'s test of a finished run reads the copy's config.json: the source's steps.)
  if not os.path.isdir(os.path.join(workdir, "checkpoints", steps[-1])):
    run_tool(["train.py", f"--config={config}", f"--workdir={workdir}", *overrides])
  after = train_summary(workdir, since_step=before["steps"])
  seconds = before["train_seconds"] + after["train_seconds"]
  tokens = before["train_tokens"] + after["train_tokens"]
  return {"steps": after["steps"], "train_seconds": seconds, "train_tokens": tokens,
          "tokens_per_second": tokens / seconds,
          "curve": before["curve"] + [(step, before["train_seconds"] + t, bpb)
                                      for step, t, bpb in after["curve"]],
          "warm_start_steps": before["steps"]}


def _train_setting(out: str, name: str) -> dict:
  """Trains (or finishes) a setting's two models; {model: (training summary,
  workdir, analyze.py flags)}, the CT also with its compressed memory
  removed: what recall the compressed slots carry."""
  _, both, ct_only = RECALL_STUDY[name]
  ct_dir, txl_dir = _setting_dirs(out, name)
  start = WARM_START.get(name)
  if start:
    _, start_both, start_ct = RECALL_STUDY[start]
    start_ct_dir, start_txl_dir = _setting_dirs(out, start)
    train(start_ct_dir, "configs/recall.py", *start_both, *start_ct)
    train(start_txl_dir, "configs/recall_txl.py", *start_both)
    runs = {"ct": (_train_from(start_ct_dir, ct_dir, "configs/recall.py", *both, *ct_only),
                   ct_dir, []),
            "txl": (_train_from(start_txl_dir, txl_dir, "configs/recall_txl.py", *both),
                    txl_dir, [])}
  else:
    runs = {"ct": (train(ct_dir, "configs/recall.py", *both, *ct_only), ct_dir, []),
            "txl": (train(txl_dir, "configs/recall_txl.py", *both), txl_dir, [])}
  runs["ct_no_compressed"] = (runs["ct"][0], ct_dir, ["--compressed_memory_length=0"])
  return runs


def _setting_config(name: str, runs: dict) -> dict:
  """What a setting compares, from both models' config.json: the sizes,
  reaches and training signal, and both complete configs."""
  what, both, ct_only = RECALL_STUDY[name]
  start = WARM_START.get(name)
  ct_dir, txl_dir = runs["ct"][1], runs["txl"][1]
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
  return {
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
      "warm_start": {"setting": start, "steps": runs["ct"][0]["warm_start_steps"]}
                    if start else None,
      "memory_gradient": m.get("memory_gradient", "none"),
      "txl_gradient_window": txl.get("gradient_window", 1),
      "txl_memory_gradient": mt.get("memory_gradient", "none"),
      # Both models' complete configs, as their workdirs' config.json hold them.
      "ct_config": ct, "txl_config": txl}


def _curve(workdir: str, since: int, reach: int) -> list[dict]:
  """Recall beyond `reach` at each kept checkpoint from step `since` on."""
  steps = sorted(int(d) for d in os.listdir(f"{workdir}/checkpoints") if d.isdigit())
  points = []
  for step in (s for s in steps if s >= since):
    cached = f"{workdir}/analysis_recall_test_step{step}.json"
    if os.path.exists(cached):
      acc = json.load(open(cached))
    else:
      acc = json.loads(run_tool(["analyze.py", f"--workdir={workdir}", "--analysis=recall",
                                 "--split=test", f"--step={step}", *_plugin(workdir)]
                                ).strip().splitlines()[-1])
    far = beyond(acc, reach)
    points.append({"step": step, "windows": step - since,
                   "whole_answer_accuracy_beyond_txl_reach": far["whole_answer_accuracy"],
                   "answer_byte_accuracy_beyond_txl_reach": far["answer_byte_accuracy"]})
  return points


def recall_setting(out: str, name: str) -> dict:
  runs = _train_setting(out, name)
  result = {"config": _setting_config(name, runs)}
  reach, one_hop = result["config"]["txl_reach"], result["config"]["txl_one_hop_reach"]
  for model, (summary, workdir, flags_) in runs.items():
    acc = recall_analysis(workdir, flags_)
    far, mid = beyond(acc, reach), beyond(acc, one_hop)
    result[model] = {
        "steps": summary["steps"], "train_seconds": summary["train_seconds"],
        "whole_answer_accuracy_beyond_txl_reach": far["whole_answer_accuracy"],
        "answer_byte_accuracy_beyond_txl_reach": far["answer_byte_accuracy"],
        "queries_beyond_txl_reach": far["queries"],
        "whole_answer_accuracy_beyond_txl_one_hop": mid["whole_answer_accuracy"],
        "answer_byte_accuracy_beyond_txl_one_hop": mid["answer_byte_accuracy"],
        "queries_beyond_txl_one_hop": mid["queries"],
        "by_distance": acc}
  if name in CURVE_SETTINGS:  # recall past the reach at every kept checkpoint of the windows
    result["curve"] = {model: _curve(runs[model][1], runs[model][0].get("warm_start_steps", 0),
                                     reach) for model in ("ct", "txl")}
  # Where the CT's facts are lost: its compressed slots probed, and where its
  # answers look (compressive/evaluation/probe.py).
  found = recall_analysis(runs["ct"][1], analysis="recall_probe")
  result["ct"]["probe"] = {"by_distance": found, "beyond_txl_reach": pooled_probe(found, reach)}
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
    line, = ax.plot(acc["distance"], acc["exact_match"], marker="o",
                    label=f"{label}: whole answers")
    ax.plot(acc["distance"], acc["byte_accuracy"], marker=".", ls="--", color=line.get_color(),
            label=f"{label}: answer bytes")
  c = r["config"]
  ax.axvline(c["txl_reach"], color="gray", ls=":",
             label=f"Transformer-XL's reach, layers x memory ({c['txl_reach']})")
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


def recall_study(out: str, names: list[str], results_dir: str) -> dict:
  """Runs the settings `names` (all when empty) into `out`, keeping the
  settings run before in results_dir/recall_study.json."""
  names = names or list(RECALL_STUDY)
  path = os.path.join(ROOT, results_dir, "recall_study.json")
  load = lambda: json.load(open(path)) if os.path.exists(path) else {"settings": {}}
  for name in names:
    r = recall_setting(out, name)
    # Read again just before writing: settings may run as concurrent commands.
    study = load()
    study["settings"][name] = r
    write_json(path, study)  # after each setting: an interrupted study keeps what it measured
  study = load()
  # The best among the settings whose three models were all measured (a
  # comparison needs its Transformer-XL: `taught`'s did not finish).
  measured = [n for n, r in study["settings"].items()
              if all("by_distance" in r.get(m, {}) for m in ("ct", "txl", "ct_no_compressed"))]
  best = max(measured, key=lambda n: (
      study["settings"][n]["ct"]["whole_answer_accuracy_beyond_txl_reach"] or 0.0,
      study["settings"][n]["ct"]["answer_byte_accuracy_beyond_txl_reach"] or 0.0))
  study["best"] = best
  write_json(path, study)
  plot_recall_study(best, study["settings"][best],
                    os.path.join(ROOT, "docs", "figures", "recall_study.png"))
  print(study_table(study), file=sys.stderr)
  return study
