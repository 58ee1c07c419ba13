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

import sys

from absl import flags
import jax

from compressive import cli, cli_flags, nested, reading
from compressive import config as config_lib
from compressive import data as data_lib
from compressive.errors import NonFiniteError
from compressive.evaluation import evaluate as eval_lib
from compressive.training import layout

FLAGS = flags.FLAGS
cli_flags.define_workdir_flags()
cli_flags.define_split_flags(
  "Split to evaluate.", "Stop after this many segments per row (a quick estimate)."
)
flags.DEFINE_integer("batch_size", None, "Rows streamed in parallel (eval.batch_size).")
flags.DEFINE_integer("segment_length", None, "Tokens per segment (eval.segment_length).")
for _name in ("batch_size", "segment_length"):
  cli_flags.validate_int_flag(
    _name, "[1, 2**31)", also=(-1,), must=">= 1 (or -1: the training run's), below 2**31"
  )
cli_flags.define_memory_flags()
cli_flags.define_multihost_flags(refer_to_train=True)


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  with reading.tool(progress=True) as place:
    experiment = reading.flagged_experiment(
      place, split=FLAGS.split, sizes=config_lib.SIZE_FIELDS, step_must_exist=True
    )
    data = experiment.data
    tokenizer = data_lib.get_tokenizer(data)
    # Evaluation reads every document: a bad one is found now, not after compiling.
    data_lib.check_documents(data, FLAGS.split, tokenizer)
    documents = data_lib.get_documents(data, FLAGS.split, tokenizer)
    run = reading.open_flagged_run(place, experiment)
    step = run.step
    result = eval_lib.evaluate(
      run.model,
      documents,
      experiment,
      max_segments=FLAGS.max_segments,
      progress_every_s=FLAGS.progress_seconds,
      split=FLAGS.split,
    )
    assert result is not None  # no `stop`: the pass runs to its end
    check_finite(result, step)
    result = {"split": FLAGS.split, "step": step, **experiment.eval.sizes, **result}
    if jax.process_index() == 0:
      report(place, result, step)


def check_finite(result: dict, step: int) -> None:
  """NonFiniteError (one line, exit 1) for a non-finite figure: never NaN in
  a result, since JSON cannot hold it and it is no figure."""
  bad = nested.non_finite(result)
  if bad:
    raise NonFiniteError(
      f"evaluating step {step} of {FLAGS.workdir} gave {', '.join(bad)}: its parameters "
      "are finite but too large to evaluate (a run diverging); nothing is written. "
      "Evaluate an earlier step with --step"
    )


def report(place: layout.Workdir, result: dict, step: int) -> None:
  """Prints the result's JSON line, then saves it in the workdir `place`
  (cli.write_result: a workdir that cannot be written loses nothing) and
  names the file on stderr."""
  path = place.eval_result(FLAGS.split, step)
  if cli.write_result(result, path, place.public):
    print(f"result: {place.public(path)}", file=sys.stderr)


if __name__ == "__main__":
  cli.run(main, __doc__)
