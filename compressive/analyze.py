"""Analyse what a checkpoint's memory does; JSON plus a PNG figure.

    python -m compressive.analyze --workdir=runs/default --analysis=attention --split=validation
    python -m compressive.analyze --workdir=runs/default --analysis=loss_by_position

`attention`: the paper's §5.5 figure, average attention weight per position
bucket over [compressed memory | memory | segment], per layer.
`loss_by_position`: mean loss by position within documents.
`recall`: accuracy on planted facts by distance (a model trained with
data.source=recall).
`recall_probe`: where a recalled fact is lost (compressive/evaluation/probe.py):
per layer and distance, whether the compressed slot holding a value byte
keeps it (a linear probe, against control slots without the fact) and
whether the answer's attention finds that slot (a model trained with
data.source=recall and a compressed memory).
`curves`: the training curve from the workdir's metrics alone (no model is
loaded; a run in progress too), redrawn as WORKDIR/curves.png, the figure
train.py draws at the end of a run; its JSON names the figure.
The JSON is printed as the last line of stdout, then written with a figure to
DIR/analysis_<name>_<split>.{json,png}, `_step<N>` added for --step=N (a workdir
that cannot be written, e.g. read-only, is a warning). A progress line (segment
i/total, tokens per second, ETA) goes to stderr every --progress_seconds.

The evaluation memory sizes and --mesh_shape work as in eval.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import IO, TYPE_CHECKING, Any, Callable, Optional, Sequence, cast

from absl import flags

from compressive import cli, cli_flags, files, nested, reading
from compressive import data as data_lib
from compressive.errors import ConfigError
from compressive.evaluation import analysis, probe
from compressive.training import curves, layout

if TYPE_CHECKING:
  from compressive import experiment as experiment_lib
  from compressive.model.transformer import CompressiveTransformer
  from compressive.training import runconfig

FLAGS = flags.FLAGS
ANALYSES = ("attention", "loss_by_position", "recall", "recall_probe", "curves")


def define_flags() -> None:
  """analyze.py's flags, defined by the tool alone (`python -m
  compressive.analyze`): importing the module for `run` defines none."""
  cli_flags.define_workdir_flags()
  flags.DEFINE_enum("analysis", "attention", list(ANALYSES), "What to measure.")
  # The same default split as eval.py's (validation; see cli_flags.define_split_flags).
  cli_flags.define_split_flags("Split.", "Stop after this many segments per row.")
  cli_flags.define_memory_flags("; 0 removes the compressed memory, to see what it contributes.")
  flags.DEFINE_integer("buckets", 6, "Buckets per bank (attention).")
  flags.DEFINE_integer("bucket_tokens", 1024, "First position bucket's size (loss_by_position).")
  for name in ("buckets", "bucket_tokens"):
    cli_flags.validate_int_flag(name, "[1, 2**31)", must=">= 1, below 2**31")


@dataclasses.dataclass(frozen=True)
class Args:
  """What analyze.py is given, as `run` takes it: its flags, parsed."""

  reading: reading.Reading  # the run, its step, memory sizes and mesh
  analysis: str = "attention"  # one of ANALYSES
  split: str = "validation"
  max_segments: Optional[int] = None  # segments per row; None: whole documents
  progress_seconds: float = 10.0  # between progress lines (logging INFO)
  buckets: int = 6  # buckets per bank (attention)
  bucket_tokens: int = 1024  # the first position bucket's size (loss_by_position)

  @classmethod
  def from_flags(cls) -> Args:
    """The Args of this process's command line (absl's FLAGS, parsed)."""
    return cls(
      reading=reading.Reading.from_flags(),
      analysis=FLAGS.analysis,
      split=FLAGS.split,
      max_segments=FLAGS.max_segments,
      progress_seconds=FLAGS.progress_seconds,
      buckets=FLAGS.buckets,
      bucket_tokens=FLAGS.bucket_tokens,
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What `run` measured (`result`, NaN as null) and where it saved it and
  its figure in the workdir (`saved`, `figure`: named as the user named the
  workdir; None where nothing was saved: `warning` says why)."""

  result: dict[str, Any]
  saved: Optional[str] = None
  figure: Optional[str] = None
  warning: Optional[str] = None


def plot_attention(result: dict[str, Any], path: IO[bytes]) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(9, 4))
  x = range(len(result["mean"]))
  for i, layer in enumerate(result["layers"]):
    ax.plot(x, layer, alpha=0.35, label=f"layer {i}")
  ax.plot(x, result["mean"], color="black", linewidth=2, label="mean")
  b = len(result["mean"]) // 3
  for edge in (b - 0.5, 2 * b - 0.5):
    ax.axvline(edge, color="grey", linestyle=":")
  ax.set_xticks(
    [b / 2 - 0.5, 1.5 * b - 0.5, 2.5 * b - 0.5], ["compressed memory", "memory", "segment"]
  )
  ax.set_ylabel("average attention weight")
  ax.set_title("Attention by position (oldest left), §5.5")
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120, format="png")


def plot_loss(result: dict[str, Any], path: IO[bytes], bucket_tokens: int) -> None:
  """The loss by position, each bucket at its end (`bucket_tokens`: the
  first bucket's size)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot(bucket_ends(result["start"], bucket_tokens), result["bits"], marker="o")
  ax.set_xscale("log")
  ax.set_xlabel("position in document (tokens, bucket end)")
  ax.set_ylabel("bits per token")
  ax.set_title("Loss by position within documents")
  fig.tight_layout()
  fig.savefig(path, dpi=120, format="png")


def bucket_ends(starts: Sequence[int], bucket_tokens: int) -> list[int]:
  """Where each loss-by-position bucket ends (the next one's start): its
  place on the log axis, which the first bucket's start, 0, has none on.
  Buckets are [0, B), [B, 2B), [2B, 4B), ... (analysis.loss_by_position)."""
  return [2 * s if s else bucket_tokens for s in starts]


def plot_recall(result: dict[str, Any], path: IO[bytes]) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot(result["distance"], result["byte_accuracy"], marker="o", label="answer bytes")
  ax.plot(result["distance"], result["exact_match"], marker="s", label="whole answers")
  ax.set_xscale("log")
  ax.set_xlabel("distance from fact to query (bytes)")
  ax.set_ylabel("accuracy")
  ax.set_ylim(0, 1)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120, format="png")


def plot_probe(result: dict[str, Any], path: IO[bytes]) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  layers = result["layers"]
  fig, axes = plt.subplots(1, len(layers), figsize=(5 * len(layers), 4), sharey=True, squeeze=False)
  for i, (ax, layer) in enumerate(zip(axes[0], layers)):
    d = result["distance"]
    ax.plot(d, layer["probe"], marker="o", label="probe: value byte from its slot")
    ax.plot(d, layer["probe_control"], marker=".", ls="--", label="probe: a slot without it")
    ax.plot(d, layer["found"], marker="s", label=f"head {layer['best_head']} finds the fact")
    ax.plot(d, result["accuracy"], marker="^", color="black", label="the model's answer")
    ax.axhline(result["chance"], color="gray", lw=0.8)
    ax.set_title(f"layer {i}")
    ax.set_xlabel("distance from fact to query (bytes)")
    ax.set_ylim(0, 1)
  axes[0][0].set_ylabel("share of answer bytes in the compressed memory")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120, format="png")


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  with reading.command(progress=FLAGS.analysis != "curves"):  # no model read for curves
    outcome = run(Args.from_flags())
  cli.report_result(outcome.result, outcome.warning, figure=outcome.figure)


def run(args: Args) -> Outcome:
  """Analyses as analyze.py's command line `args` says (each mistake a
  UserError naming it) and saves the result and its figure in the workdir;
  see the module's docstring."""
  if args.analysis == "curves":
    with reading.opened(args.reading) as place:
      metrics = place.metrics("train")
      if not os.path.isfile(metrics):
        raise ConfigError(
          f"--analysis=curves draws a run's metrics: {args.reading.workdir} holds no "
          f"{os.path.basename(metrics)} (an export keeps none)"
        )
      result = curves.draw(place)  # titled with the run's name (a gs:// run's URL)
    return Outcome({**result, "figure": place.public(result["figure"])})
  with reading.opened(args.reading) as place:
    experiment = reading.experiment_of(
      place, args.reading, check=lambda config: check_recall(config, args)
    )
    sizes = {name: args.reading.sizes.get(name) for name in reading.MEMORY_FLAGS}
    suffix = "".join(f"_{name}{value}" for name, value in sizes.items() if value is not None)
    if args.reading.step is not None:  # an earlier checkpoint's result never replaces the newest's
      suffix += f"_step{args.reading.step}"
    # The corpus before the model: a corpus that cannot be read fails before any loading.
    tokenizer = data_lib.get_tokenizer(experiment.data)
    documents = data_lib.get_documents(experiment.data, args.split, tokenizer)
    model = reading.open_run(place, args.reading, experiment).model
    result, plot = _measure(args, model, documents, experiment)
    return _save(args, place, result, plot, suffix)


def check_recall(config: runconfig.SavedConfig, args: Args) -> None:
  """ConfigError for --analysis=recall or recall_probe of a run not trained
  on recall data, or recall_probe without a compressed memory to probe."""
  if args.analysis not in ("recall", "recall_probe"):
    return
  workdir = args.reading.workdir
  if config.data.source != "recall":
    raise ConfigError(
      f"--analysis={args.analysis} needs a model trained with "
      f"data.source=recall; {workdir} was trained on "
      f"data.source={config.data.source}"
    )
  given = args.reading.sizes.get("compressed_memory_length")
  compressed = given if given is not None else config.model.compressed_memory_length
  if args.analysis == "recall_probe" and not compressed:
    raise ConfigError(
      "--analysis=recall_probe reads the compressed memory: "
      f"{workdir} evaluates without one (compressed_memory_length=0)"
    )


def _measure(
  args: Args,
  model: CompressiveTransformer,
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
) -> tuple[dict[str, Any], Callable[[dict[str, Any], IO[bytes]], None]]:
  """(the result of `args.analysis` of the checked `experiment`, the function that plots it)."""
  every, max_segments = args.progress_seconds, args.max_segments
  if args.analysis == "attention":
    return _attention(args, model, documents, experiment), plot_attention
  recall = cast(data_lib.recall.RecallDocuments, documents)
  if args.analysis == "recall":
    return analysis.recall_accuracy(
      model, recall, experiment, max_segments=max_segments, progress_every_s=every
    ), plot_recall
  if args.analysis == "recall_probe":
    try:
      return probe.recall_probe(
        model, recall, experiment, max_segments=max_segments, progress_every_s=every
      ), plot_probe
    except ValueError as e:  # no answer's value in the compressed memory
      raise ConfigError(f"{e} (--split={args.split}, --max_segments={max_segments})") from None
  result = analysis.loss_by_position(
    model,
    documents,
    experiment,
    bucket_tokens=args.bucket_tokens,
    max_segments=max_segments,
    progress_every_s=every,
  )
  return result, functools.partial(plot_loss, bucket_tokens=args.bucket_tokens)


def _attention(
  args: Args,
  model: CompressiveTransformer,
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
) -> dict[str, Any]:
  """The attention analysis's result; ConfigError naming --split and
  --max_segments when no segment of theirs fills the memories."""
  try:
    result = analysis.attention_by_bucket(
      model,
      documents,
      experiment,
      buckets=args.buckets,
      max_segments=args.max_segments,
      progress_every_s=args.progress_seconds,
    )
  except ValueError as e:  # the split's documents are too short to fill the memories
    if not str(e).startswith("no segment had full memories"):
      raise
    raise ConfigError(f"{e} (--split={args.split}, --max_segments={args.max_segments})") from None
  return result


def _save(
  args: Args,
  place: layout.Workdir,
  result: dict[str, Any],
  plot: Callable[[dict[str, Any], IO[bytes]], None],
  suffix: str,
) -> Outcome:
  """The result (NaN as null) saved, then its figure, beside the workdir
  `place`'s files, each whole (cli.save_result, files.replacing): a workdir
  that cannot be written loses nothing, the Outcome says why."""
  # NaN (a bucket no token reached, a diverged model) is JSON's null.
  result = nested.finite_or_null(result)
  path = place.analysis_result(args.analysis, args.split, suffix, "json")
  warning = cli.save_result(result, path, place.public)
  if warning is not None:
    return Outcome(result, warning=warning)
  figure = place.analysis_result(args.analysis, args.split, suffix, "png")
  try:
    with files.replacing(figure, binary=True) as f:  # whole or not at all
      plot(result, f)
  except OSError as e:
    reason = f"cannot write {place.public(figure)}: {e.strerror or e}"
    return Outcome(
      result, saved=place.public(path), warning=f"the result is saved but not its figure: {reason}"
    )
  return Outcome(result, saved=place.public(path), figure=place.public(figure))


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__)
