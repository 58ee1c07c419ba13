"""The table of docs/SCALING.md §Before renting the hardware: every preset x paper
experiment compiled ahead of time for its hardware by aot.py.

    make aot-venv
    .venv-aot/bin/python benchmarks/aot_table.py            # all rows, ~15 min on 2 cores
    .venv-aot/bin/python benchmarks/aot_table.py --rows=tpu_v5e8:pg19

Runs aot.py once per row (a fresh process each, so compile times do not
share caches), writes every row's JSON to docs/results/aot_table.json and
prints the markdown table. Step time at 40% MFU = our model FLOPs per step /
(devices x the device's bf16 peak x 0.4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_list("rows", [], "Row names to run (default all).")
flags.DEFINE_string(
  "out",
  os.path.join(ROOT, "docs", "results", "aot_table.json"),
  "Where to write the rows' JSON ('' = nowhere).",
)

# name: (config, target, extra aot.py flags). gpu1 and gpu8 are costed on
# H100 80 GB; the multi-node rows override the presets' 8-device mesh.
ROWS = {
  "gpu1:enwik8": ("configs/gpu1.py:enwik8", "gpu:h100-1", []),
  "gpu1:pg19": ("configs/gpu1.py:pg19", "gpu:h100-1", []),
  "gpu8:enwik8": ("configs/gpu8.py:enwik8", "gpu:h100-8", []),
  "gpu8:pg19": ("configs/gpu8.py:pg19", "gpu:h100-8", []),
  "tpu_v5e8:enwik8": ("configs/tpu_v5e8.py:enwik8", "tpu:v5e-8", []),
  "tpu_v5e8:pg19": ("configs/tpu_v5e8.py:pg19", "tpu:v5e-8", []),
  "tpu_v5e8:pg19 on v5e-32": (
    "configs/tpu_v5e8.py:pg19",
    "tpu:v5e-32",
    ["--config.mesh.shape=(1,-1,1)"],
  ),
  "gpu8:pg19 on 2 x 8 H200": (
    "configs/gpu8.py:pg19",
    "gpu:h200-8x2",
    ["--config.mesh.shape=(-1,1,1)"],
  ),
}


def run_row(name: str) -> dict:
  config, target, extra = ROWS[name]
  cmd = [
    sys.executable,
    os.path.join(ROOT, "aot.py"),
    f"--config={config}",
    f"--target={target}",
    *extra,
  ]
  print(f"{name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  lines = proc.stdout.strip().splitlines()
  row = {
    "row": name,
    "command": " ".join(["python", *cmd[1:]]).replace(ROOT + "/", ""),
    "exit_code": proc.returncode,
  }
  if lines and lines[-1].startswith("{"):
    row.update(json.loads(lines[-1]))
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  if errors:
    row["error"] = errors[-1]
  elif proc.returncode and not lines:
    row["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  print(f"  -> exit {proc.returncode}", file=sys.stderr, flush=True)
  return row


def _gib(n) -> str:
  return "-" if n is None else f"{n / 1024**3:.1f}"


def markdown(rows: list[dict]) -> str:
  out = [
    "| preset : experiment | target | GiB per device / device | fits | compile s | "
    "model TFLOP per step | step s at 40% MFU |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    per = r.get("per_device", {}).get("total")
    fits = {True: "yes", False: "**no**", None: "-"}[r.get("fits")] if "fits" in r else "**no**"
    mfu = r.get("step_seconds_at_40pct_mfu")
    out.append(
      f"| {r['row']} | {r.get('target', '-')} "
      f"| {_gib(per)} / {_gib(r.get('device_memory_bytes'))} "
      f"| {fits} | {r.get('compile_seconds', '-')} "
      f"| {r['model_flops_per_step'] / 1e12:.0f} | {'-' if mfu is None else f'{mfu:.2f}'} |"
      if "model_flops_per_step" in r
      else f"| {r['row']} | - | - | **no** | - | - | - |"
    )
  return "\n".join(out)


def main(argv):
  del argv
  names = FLAGS.rows or list(ROWS)
  unknown = [n for n in names if n not in ROWS]
  if unknown:
    sys.exit(f"error: unknown rows {unknown}; choose from {list(ROWS)}")
  rows = [run_row(n) for n in names]
  if FLAGS.out:
    os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
    previous = {}
    if os.path.exists(FLAGS.out) and FLAGS.rows:
      with open(FLAGS.out) as f:
        previous = {r["row"]: r for r in json.load(f)}
    previous.update({r["row"]: r for r in rows})
    with open(FLAGS.out, "w") as f:
      json.dump([previous[n] for n in ROWS if n in previous], f, indent=1)
  print(markdown(rows))


if __name__ == "__main__":
  app.run(main)
