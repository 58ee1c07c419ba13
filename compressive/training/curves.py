"""A run's training curve as a figure: WORKDIR/curves.png.

Drawn from the metrics files alone (metrics_train.jsonl, metrics_eval.jsonl)
by the trainer's process 0 at the end of every run that returns (finished
or stopped), and by `analyze.py --analysis=curves` at any time, a run in
progress included. Training's bits per byte (or per token, for a
SentencePiece vocabulary) by step, and each evaluation's estimate on the
same axes. The figure is replaced whole (files.replacing); a workdir that
cannot hold it is a warning, never the run's failure.
"""

from __future__ import annotations

import logging
from typing import Optional

from compressive import files
from compressive.training import layout
from compressive.training.metrics import read_jsonl

_log = logging.getLogger("compressive")


def _points(rows: list[dict]) -> tuple[str, list[tuple[int, float]]]:
  """(the bits' name, (step, bits) of every record that holds them)."""
  name = "bits_per_byte" if any("bits_per_byte" in r for r in rows) else "bits_per_token"
  return name, [
    (int(r["step"]), float(r[name]))
    for r in rows
    if isinstance(r.get(name), (int, float)) and "step" in r
  ]


def draw(workdir: layout.Where) -> dict:
  """Writes the figure; what it shows: its path, its title and the points
  drawn."""
  from matplotlib.figure import Figure  # no pyplot: no global state, any thread

  run = layout.workdir(workdir)
  name, train = _points(read_jsonl(run.metrics("train"), run.public))
  _, evals = _points(read_jsonl(run.metrics("eval"), run.public))
  fig = Figure(figsize=(7, 4))
  ax = fig.subplots()
  if train:
    ax.plot(*zip(*train), label=f"training {name.replace('_', ' ')}")
  if evals:
    ax.plot(*zip(*evals), marker="o", linestyle="--", label="evaluation estimate")
  ax.set_xlabel("step")
  ax.set_ylabel(name.replace("_", " "))
  ax.grid(alpha=0.3)
  if train or evals:
    ax.legend()
  title = f"training curve of {run.name}"  # a gs:// run's URL, not its mirror
  ax.set_title(title, fontsize=9)
  with files.replacing(run.curves, binary=True) as f:
    fig.savefig(f, format="png", dpi=100)
  return {
    "figure": run.curves,
    "title": title,
    "train_points": len(train),
    "eval_points": len(evals),
  }


def draw_at_the_end(workdir: layout.Where) -> Optional[str]:
  """`draw`, at the end of a run, logging where the figure is; one that
  cannot be written is a warning line. The figure's path, or None."""
  run = layout.workdir(workdir)
  try:
    figure = draw(run)["figure"]
    _log.info("training curve: %s", run.public(figure))
    return figure
  except OSError as e:
    _log.warning(
      "the training curve was not drawn: cannot write %s: %s",
      run.public(run.curves),
      e.strerror or e,
    )
    return None
