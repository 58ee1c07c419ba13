"""Evaluate a training workdir: python -m compressive.eval --workdir=DIR [--split=validation].

Streams whole documents of the split through the model with the evaluation
memory sizes of the workdir's config (override them with the flags below).
Prints the result as one JSON object on the last line of stdout, then writes it
to DIR/eval_<split>_step<N>.json and names that file on stderr (a workdir
that cannot be written, e.g. read-only, is a warning). Checkpoints are only
read, never written. On PG-19 a whole split also gives `word_perplexity` with
`words` (counted) and, for validation and test, `words_official`, its normaliser
(compressive/evaluation/evaluate.py).

The checkpoint is restored onto this machine's devices, whatever mesh trained
it: the saved config's `mesh.shape` is used if it fits this machine's devices,
else data parallel over all of them (-1,1,1), unless --mesh_shape says
otherwise (e.g. --mesh_shape=1,8,1 to keep parameters sharded). Multi-host:
the same flags as train.py (--multihost, or --coordinator_address,
--num_processes, --process_id); process 0 prints and writes the result.

A progress line (segment i/total, tokens per second, ETA) goes to stderr
every --progress_seconds; stdout holds only the result.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from absl import flags
import jax

from compressive import cli, cli_flags, nested, reading
from compressive import config as config_lib
from compressive import data as data_lib
from compressive.errors import NonFiniteError
from compressive.evaluation import evaluate as eval_lib
from compressive.training import layout

FLAGS = flags.FLAGS


def define_flags() -> None:
  """eval.py's flags, defined by the tool alone (`python -m
  compressive.eval`): importing the module for `run` defines none."""
  cli_flags.define_workdir_flags()
  cli_flags.define_split_flags(
    "Split to evaluate.", "Stop after this many segments per row (a quick estimate)."
  )
  flags.DEFINE_integer("batch_size", None, "Rows streamed in parallel (eval.batch_size).")
  flags.DEFINE_integer("segment_length", None, "Tokens per segment (eval.segment_length).")
  for name in ("batch_size", "segment_length"):
    cli_flags.validate_int_flag(
      name, "[1, 2**31)", also=(-1,), must=">= 1 (or -1: the training run's), below 2**31"
    )
  cli_flags.define_memory_flags()
  cli_flags.define_multihost_flags(refer_to_train=True)


@dataclasses.dataclass(frozen=True)
class Args:
  """What eval.py is given, as `run` takes it: its flags, parsed."""

  reading: reading.Reading  # the run, its step, sizes (config.SIZE_FIELDS) and mesh
  split: str = "validation"
  max_segments: Optional[int] = None  # segments per row; None: whole documents
  progress_seconds: float = 10.0  # between progress lines (logging INFO)

  @classmethod
  def from_flags(cls) -> Args:
    """The Args of this process's command line (absl's FLAGS, parsed)."""
    return cls(
      reading=reading.Reading.from_flags(sizes=config_lib.SIZE_FIELDS),
      split=FLAGS.split,
      max_segments=FLAGS.max_segments,
      progress_seconds=FLAGS.progress_seconds,
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What `run` measured (`result`: the split, the step, the evaluation's
  sizes and its metrics) and where it saved it in the workdir (`saved`,
  named as the user named the workdir; None where it could not be written:
  `warning` says why, the result is whole)."""

  result: dict[str, Any]
  saved: Optional[str]
  warning: Optional[str] = None


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  with reading.command(progress=True):
    outcome = run(Args.from_flags())
  if jax.process_index() == 0:  # process 0 prints what it saved
    cli.report_result(outcome.result, outcome.warning, result=outcome.saved)


def run(args: Args) -> Outcome:
  """Evaluates as eval.py's command line `args` says (each mistake a
  UserError naming it) and saves the result in the workdir (process 0);
  see the module's docstring."""
  with reading.opened(args.reading) as place:
    experiment = reading.experiment_of(place, args.reading, split=args.split, step_must_exist=True)
    data = experiment.data
    tokenizer = data_lib.get_tokenizer(data)
    # Evaluation reads every document: a bad one is found now, not after compiling.
    data_lib.check_documents(data, args.split, tokenizer)
    documents = data_lib.get_documents(data, args.split, tokenizer)
    opened = reading.open_run(place, args.reading, experiment)
    step = opened.step
    metrics = eval_lib.evaluate(
      opened.model,
      documents,
      experiment,
      max_segments=args.max_segments,
      progress_every_s=args.progress_seconds,
      split=args.split,
    )
    assert metrics is not None  # no `stop`: the pass runs to its end
    check_finite(metrics, step, args.reading.workdir)
    result = {"split": args.split, "step": step, **experiment.eval.sizes, **metrics}
    if jax.process_index():
      return Outcome(result, saved=None)
    return _save(place, result, step, args.split)


def check_finite(result: dict, step: int, workdir: str) -> None:
  """NonFiniteError (one line, exit 1) for a non-finite figure: never NaN in
  a result, since JSON cannot hold it and it is no figure."""
  bad = nested.non_finite(result)
  if bad:
    raise NonFiniteError(
      f"evaluating step {step} of {workdir} gave {', '.join(bad)}: its parameters "
      "are finite but too large to evaluate (a run diverging); nothing is written. "
      "Evaluate an earlier step with --step"
    )


def _save(place: layout.Workdir, result: dict[str, Any], step: int, split: str) -> Outcome:
  """The result saved in the workdir `place` (cli.save_result, whole): a
  workdir that cannot be written loses nothing, the Outcome says why."""
  path = place.eval_result(split, step)
  warning = cli.save_result(result, path, place.public)
  return Outcome(result, saved=None if warning else place.public(path), warning=warning)


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__)
