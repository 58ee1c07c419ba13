"""The recall study of experiments/run.py (--experiment=recall_study):
configs/recall.py (Compressive Transformer) against configs/recall_txl.py
(Transformer-XL, memory = CT memory + compressed memory: equal attention
cost), one thing changed at a time (RECALL_STUDY, experiments/recall_settings.py),
each setting's CT also evaluated with its compressed memory removed; accuracy
beyond the Transformer-XL's reach (docs/RESULTS.md §2)."""

from __future__ import annotations

import json
import os
import sys

if __package__:  # imported as experiments.recall_study (the tests, run.py)
  from experiments.children import run_tool, train, train_summary, write_json
  from experiments.recall_settings import CHANCE, CURVE_SETTINGS, RECALL_STUDY, WARM_START
else:  # run.py run as a script: experiments/ is on sys.path
  from children import run_tool, train, train_summary, write_json
  from recall_settings import CHANCE, CURVE_SETTINGS, RECALL_STUDY, WARM_START

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recall_analysis(
  workdir: str, flags_: list[str] | tuple[str, ...] = (), analysis: str = "recall"
) -> dict:
  """analyze.py --analysis=recall (or recall_probe) on the test split;
  reuses an earlier run's output."""
  suffix = "".join("_" + f[2:].replace("=", "") for f in flags_)
  cached = f"{workdir}/analysis_{analysis}_test{suffix}.json"
  if os.path.exists(cached):
    return json.load(open(cached))
  return json.loads(
    run_tool(
      [
        "analyze.py",
        f"--workdir={workdir}",
        f"--analysis={analysis}",
        "--split=test",
        *_plugin(workdir),
        *flags_,
      ]
    )
    .strip()
    .splitlines()[-1]
  )


def _plugin(workdir: str) -> list[str]:
  """--plugin for a run whose compression is a plugin (`module:Name`): a
  saved config never imports code by itself."""
  with open(f"{workdir}/config.json") as f:
    name = json.load(f)["model"]["compression"]
  return [f"--plugin={name.split(':')[0]}"] if ":" in name else []


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

  return {
    "samples": sum(n),
    "accuracy": pool(result["accuracy"]),
    "layers": [
      {
        k: pool(layer[k])
        for k in ("probe", "probe_control", "found", "value_weight", "other_weight")
      }
      for layer in result["layers"]
    ],
  }


def beyond(acc: dict, reach: int) -> dict:
  """Pooled accuracy over the distances > reach of an analyze.py recall result."""
  sel = [i for i, d in enumerate(acc["distance"]) if d > reach]
  n = sum(acc["queries"][i] for i in sel)
  if not n:
    return {"queries": 0, "answer_byte_accuracy": None, "whole_answer_accuracy": None}
  pooled = lambda key: sum(acc[key][i] * acc["queries"][i] for i in sel) / n
  return {
    "queries": n,
    "answer_byte_accuracy": pooled("byte_accuracy"),
    "whole_answer_accuracy": pooled("exact_match"),
  }


def _slug(overrides) -> str:
  return (
    "_".join(o[len("--config.") :].translate(str.maketrans(".,", "__", "=()")) for o in overrides)
    or "base"
  )


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
    shutil.copytree(
      source, workdir, ignore=shutil.ignore_patterns("train.lock*", "analysis_*", "result_*")
    )
  steps = [o.split("=", 1)[1] for o in overrides if o.startswith("--config.num_train_steps=")]
  assert steps, "a warm start names the steps it trains to"
  # (train()'s test of a finished run reads the copy's config.json: the source's steps.)
  if not os.path.isdir(os.path.join(workdir, "checkpoints", steps[-1])):
    run_tool(["train.py", f"--config={config}", f"--workdir={workdir}", *overrides])
  after = train_summary(workdir, since_step=before["steps"])
  seconds = before["train_seconds"] + after["train_seconds"]
  tokens = before["train_tokens"] + after["train_tokens"]
  return {
    "steps": after["steps"],
    "train_seconds": seconds,
    "train_tokens": tokens,
    "tokens_per_second": tokens / seconds,
    "curve": before["curve"]
    + [(step, before["train_seconds"] + t, bpb) for step, t, bpb in after["curve"]],
    "warm_start_steps": before["steps"],
  }


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
    runs = {
      "ct": (_train_from(start_ct_dir, ct_dir, "configs/recall.py", *both, *ct_only), ct_dir, []),
      "txl": (_train_from(start_txl_dir, txl_dir, "configs/recall_txl.py", *both), txl_dir, []),
    }
  else:
    runs = {
      "ct": (train(ct_dir, "configs/recall.py", *both, *ct_only), ct_dir, []),
      "txl": (train(txl_dir, "configs/recall_txl.py", *both), txl_dir, []),
    }
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
    "what": what,
    "ct_overrides": list(both + ct_only),
    "txl_overrides": list(both),
    "ct_workdir": os.path.relpath(ct_dir, ROOT),
    "txl_workdir": os.path.relpath(txl_dir, ROOT),
    "num_layers": m["num_layers"],
    "d_model": m["d_model"],
    "segment_length": m["segment_length"],
    "memory_length": m["memory_length"],
    "compressed_memory_length": m["compressed_memory_length"],
    "compression_rate": m["compression_rate"],
    "compression": m["compression"],
    "reconstruction_loss": m["reconstruction_loss"],
    "txl_memory_length": mt["memory_length"],
    "steps": ct["num_train_steps"],
    "requery_distances": list(ct["data"]["recall"].get("requery_distances", ())),
    "txl_reach": txl_reach,
    "txl_one_hop_reach": txl_one_hop,
    "ct_one_hop_reach": m["memory_length"]
    + m["compression_rate"] * m["compressed_memory_length"]
    + m["segment_length"],
    "chance": CHANCE,
    "gradient_window": ct.get("gradient_window", 1),
    "warm_start": {"setting": start, "steps": runs["ct"][0]["warm_start_steps"]} if start else None,
    "memory_gradient": m.get("memory_gradient", "none"),
    "txl_gradient_window": txl.get("gradient_window", 1),
    "txl_memory_gradient": mt.get("memory_gradient", "none"),
    # Both models' complete configs, as their workdirs' config.json hold them.
    "ct_config": ct,
    "txl_config": txl,
  }


def _curve(workdir: str, since: int, reach: int) -> list[dict]:
  """Recall beyond `reach` at each kept checkpoint from step `since` on."""
  steps = sorted(int(d) for d in os.listdir(f"{workdir}/checkpoints") if d.isdigit())
  points = []
  for step in (s for s in steps if s >= since):
    cached = f"{workdir}/analysis_recall_test_step{step}.json"
    if os.path.exists(cached):
      acc = json.load(open(cached))
    else:
      acc = json.loads(
        run_tool(
          [
            "analyze.py",
            f"--workdir={workdir}",
            "--analysis=recall",
            "--split=test",
            f"--step={step}",
            *_plugin(workdir),
          ]
        )
        .strip()
        .splitlines()[-1]
      )
    far = beyond(acc, reach)
    points.append(
      {
        "step": step,
        "windows": step - since,
        "whole_answer_accuracy_beyond_txl_reach": far["whole_answer_accuracy"],
        "answer_byte_accuracy_beyond_txl_reach": far["answer_byte_accuracy"],
      }
    )
  return points


def recall_setting(out: str, name: str) -> dict:
  runs = _train_setting(out, name)
  result = {"config": _setting_config(name, runs)}
  reach, one_hop = result["config"]["txl_reach"], result["config"]["txl_one_hop_reach"]
  for model, (summary, workdir, flags_) in runs.items():
    acc = recall_analysis(workdir, flags_)
    far, mid = beyond(acc, reach), beyond(acc, one_hop)
    result[model] = {
      "steps": summary["steps"],
      "train_seconds": summary["train_seconds"],
      "whole_answer_accuracy_beyond_txl_reach": far["whole_answer_accuracy"],
      "answer_byte_accuracy_beyond_txl_reach": far["answer_byte_accuracy"],
      "queries_beyond_txl_reach": far["queries"],
      "whole_answer_accuracy_beyond_txl_one_hop": mid["whole_answer_accuracy"],
      "answer_byte_accuracy_beyond_txl_one_hop": mid["answer_byte_accuracy"],
      "queries_beyond_txl_one_hop": mid["queries"],
      "by_distance": acc,
    }
  if name in CURVE_SETTINGS:  # recall past the reach at every kept checkpoint of the windows
    result["curve"] = {
      model: _curve(runs[model][1], runs[model][0].get("warm_start_steps", 0), reach)
      for model in ("ct", "txl")
    }
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
  labels = {
    "ct": "Compressive Transformer",
    "txl": "Transformer-XL (equal attention cost)",
    "ct_no_compressed": "Compressive Transformer, compressed memory removed",
  }
  for model, label in labels.items():
    acc = r[model]["by_distance"]
    (line,) = ax.plot(
      acc["distance"], acc["exact_match"], marker="o", label=f"{label}: whole answers"
    )
    ax.plot(
      acc["distance"],
      acc["byte_accuracy"],
      marker=".",
      ls="--",
      color=line.get_color(),
      label=f"{label}: answer bytes",
    )
  c = r["config"]
  ax.axvline(
    c["txl_reach"],
    color="gray",
    ls=":",
    label=f"Transformer-XL's reach, layers x memory ({c['txl_reach']})",
  )
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
  rows = [
    "| setting | steps | CT whole answers / answer bytes | TXL | CT, compressed memory "
    "removed | queries |",
    "|---|---|---|---|---|---|",
  ]
  for name, r in study["settings"].items():
    cells = [
      f"{pct(r[m]['whole_answer_accuracy_beyond_txl_reach'], 2)} / "
      f"{pct(r[m]['answer_byte_accuracy_beyond_txl_reach'])}"
      for m in ("ct", "txl", "ct_no_compressed")
    ]
    rows.append(
      f"| `{name}`: {r['config']['what']} | {r['config']['steps']} | "
      + " | ".join(cells)
      + f" | {r['ct']['queries_beyond_txl_reach']:,} |"
    )
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
  measured = [
    n
    for n, r in study["settings"].items()
    if all("by_distance" in r.get(m, {}) for m in ("ct", "txl", "ct_no_compressed"))
  ]
  best = max(
    measured,
    key=lambda n: (
      study["settings"][n]["ct"]["whole_answer_accuracy_beyond_txl_reach"] or 0.0,
      study["settings"][n]["ct"]["answer_byte_accuracy_beyond_txl_reach"] or 0.0,
    ),
  )
  study["best"] = best
  write_json(path, study)
  plot_recall_study(
    best, study["settings"][best], os.path.join(ROOT, "docs", "figures", "recall_study.png")
  )
  print(study_table(study), file=sys.stderr)
  return study
