"""Train a Compressive Transformer:

    python -m compressive.train --config=NAME --workdir=DIR

NAME is a shipped config (default, enwik8, pg19, ...; --help lists them) or
a config file of your own (--config=path/to/mine.py).

Override any config field with --config.a.b=value (a typo is an error). A
workdir that already holds checkpoints is resumed from its latest one, on
whatever mesh this run's config and devices give.

Process 0 also appends the log to WORKDIR/train.log; --profile_steps=START,END
writes a JAX profiler trace of those steps to WORKDIR/profile.

Multi-host (docs/SCALING.md §Several processes): start the same command on every host with
--multihost (Cloud TPU slices, SLURM and Open MPI are detected), or with
--coordinator_address=HOST:PORT --num_processes=N --process_id=I anywhere
else; the workdir must be shared by all hosts. Process 0 alone writes the
config, metrics and logs; checkpoints are written by all together.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
from typing import Any, Optional

from compressive.training import interrupts

if __name__ == "__main__":  # the tool, not an import: before JAX's imports, a signal is heard
  interrupts.hold_early_signals()

# noqa: E402
from absl import flags
import jax

from compressive import cli, cli_config, cli_flags, errors, storage, values
from compressive import config as config_lib
from compressive import data as data_lib
from compressive.errors import ConfigError
from compressive.scale import processes
from compressive.training import checkpoint as ckpt_lib
from compressive.training import dryrun, layout, writers
from compressive.training import loop as train_lib

FLAGS = flags.FLAGS


def define_flags() -> None:
  """train.py's flags, defined by the tool alone (`python -m
  compressive.train`): importing the module for `run` defines none."""
  cli.define_config_flag(default="default.py")
  # Required, but for --print_config, which writes nothing (main checks it).
  cli_flags.define_workdir_flags(
    "Checkpoints, metrics and TensorBoard logs go here.", step=False, required=False
  )
  cli_flags.define_multihost_flags()
  flags.DEFINE_bool(
    "restore_intact",
    False,
    "If the newest checkpoint cannot be restored (truncated, corrupt), resume "
    "from the newest one that can instead of stopping with an error.",
  )
  flags.DEFINE_bool(
    "accept_changed_corpus",
    False,
    "Resume even though the training corpus (a text_files folder's files, or "
    "the data section's generating fields, e.g. data.synthetic.seed) changed "
    "since the checkpoint was saved; without it, that stops the run with one "
    "line.",
  )
  flags.DEFINE_bool(
    "print_config",
    False,
    "Print the config the command line gives, after its checks (not of its "
    "data, whose paths may be yet to fill in), as JSON: what the run's "
    "config.json would record (every field, evaluation's sizes resolved); "
    "then exit, training nothing and writing nothing.",
  )
  flags.DEFINE_bool(
    "dry_run",
    False,
    "Check everything a start checks (the config, the data, every document "
    "read once, the model's size on this machine's devices, whether the workdir "
    "would resume), say so in one line and exit 0, training nothing and "
    "writing nothing.",
  )
  flags.DEFINE_string(
    "profile_steps",
    "",
    "START,END: a JAX profiler trace of steps START to END (inclusive) into "
    "WORKDIR/profile, for TensorBoard's profile tab (default: none).",
  )


@dataclasses.dataclass(frozen=True)
class Args:
  """What train.py is given, as `run` takes it: its flags, parsed."""

  config: Any  # --config, its overrides applied (what the config file returns)
  workdir: Optional[str]  # --workdir: a folder, or a gs:// URL
  config_name: str = ""  # --config as typed, for the start's first line
  overridden: frozenset[str] = frozenset()  # the fields --config.X overrides, dotted
  restore_intact: bool = False
  accept_changed_corpus: bool = False
  print_config: bool = False
  dry_run: bool = False
  profile_steps: Optional[tuple[int, int]] = None  # (START, END) of a trace
  storage_deadline: Optional[float] = storage.DEFAULT_DEADLINE_S  # None: no deadline

  @classmethod
  def from_flags(cls) -> Args:
    """The Args of this process's command line (absl's FLAGS, parsed;
    ConfigError for a --profile_steps that names no steps)."""
    return cls(
      config=FLAGS.config,
      workdir=FLAGS.workdir,
      config_name=cli_config.config_argument(sys.argv, "config"),
      overridden=frozenset(cli_config.overridden_fields(sys.argv)),
      restore_intact=FLAGS.restore_intact,
      accept_changed_corpus=FLAGS.accept_changed_corpus,
      print_config=FLAGS.print_config,
      dry_run=FLAGS.dry_run,
      profile_steps=config_lib.profile_steps(FLAGS.profile_steps),
      storage_deadline=FLAGS.storage_deadline or None,
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What `run` did: `printed`, the text --print_config or --dry_run gives
  (nothing trained); else the run's last evaluation (`result`), where its
  TensorBoard logs are (`tensorboard`, named as the user named the
  workdir, or None without that writer), and the step it stopped at when
  that is before its last (`stopped`: a signal, or another process's
  preemption notice)."""

  printed: Optional[str] = None
  result: Optional[dict[str, float]] = None
  tensorboard: Optional[str] = None
  stopped: Optional[int] = None
  num_train_steps: int = 0


def setup_logging() -> None:
  cli.quiet_libraries()
  # One log for the run: process 0's (the others log only warnings).
  level = logging.INFO if jax.process_index() == 0 else logging.WARNING
  logging.getLogger("compressive").setLevel(level)


def main(argv: list[str]) -> None:
  del argv  # cli.parse_flags refuses positional arguments
  if FLAGS.workdir is None and not FLAGS.print_config:
    cli.fail("--workdir is required (only --print_config runs without one)")
  try:
    interrupts.release_early_signals()
    with cli.user_errors():
      args = Args.from_flags()
      processes.join_as_flagged()  # before the check: it counts every process's devices
      setup_logging()
      outcome = run(args)
    _report(outcome)
  except KeyboardInterrupt:
    # Ctrl-C before training started, or a second signal during it: stopped
    # where it was, once the save in flight (if any) was finished.
    signum = interrupts.received() or signal.SIGINT
    cli.fail(
      f"stopped at once by {signal.Signals(signum).name}; the same command resumes "
      f"from the newest checkpoint in {FLAGS.workdir}",
      code=errors.exit_status(signum),
    )
  finally:  # a stop or a failure while joining the other processes: no wait for them at exit
    if processes.join_unfinished():
      error = sys.exc_info()[1]
      storage.exit_now(error.code if isinstance(error, SystemExit) else 1)


def run(args: Args) -> Outcome:
  """Trains as train.py's command line `args` says (the checks first, each
  mistake a UserError naming it; a stop signal stops it after a step,
  checkpointed, and KeyboardInterrupt at a second); see the module's
  docstring. A run of several processes calls it in each, once they joined
  JAX's distributed runtime (main does that from the multi-host flags)."""
  profile = args.profile_steps
  config = args.config
  # A field of a source the run does not read: refused from the command
  # line, a warning from a config file (data.check_unread_sections).
  if "data" in config:
    data_lib.check_unread_sections(data_lib.DataConfig.from_dict(config.data), args.overridden)
  if args.print_config:  # what config.json would record: every field, as the run reads it
    # The config's own checks and its mesh against this machine's devices;
    # not its data (a path to fill in) nor its size here.
    experiment = config_lib.check(config, here=False, num_devices=jax.device_count())
    return Outcome(printed=json.dumps(experiment.to_dict(), indent=2))
  experiment = config_lib.check(config)
  last = experiment.train.num_train_steps
  if profile is not None and profile[0] > last:
    raise ConfigError(
      f"--profile_steps={profile[0]},{profile[1]} starts after the run's last step "
      f"(num_train_steps={last}): no trace would be taken"
    )
  if args.workdir is None:
    raise ConfigError("--workdir is required (only --print_config runs without one)")
  # The workdir, opened (a gs:// URL through a local mirror of its files).
  with layout.opened(args.workdir, args.storage_deadline) as place:
    if args.dry_run:
      return Outcome(printed=dryrun.dry_run(experiment, place))
    with interrupts.SignalStop() as stop:
      result = train_lib.train_and_evaluate(
        experiment,
        place,
        should_stop=stop.should_stop,
        restore_intact=args.restore_intact,
        profile_steps=profile,
        accept_changed_corpus=args.accept_changed_corpus,
        config_name=args.config_name,
      )
    stopped = _stopped_before(place, last)
  board = writers.TENSORBOARD in experiment.train.metric_writers
  return Outcome(
    result=result,
    tensorboard=place.public(place.tensorboard()) if board else None,
    stopped=stopped,
    num_train_steps=last,
  )


def _report(outcome: Outcome) -> None:
  """What the command says once `run` returned: what it printed; else, on
  process 0, where TensorBoard's logs are and the final evaluation; for a
  run that stopped before its last step, the stop, as a failure whose
  status says which signal (so that a retry loop or a job controller
  starts it again)."""
  if outcome.printed is not None:
    print(outcome.printed)
    return
  if not jax.process_index():
    if outcome.tensorboard is not None:
      print("TensorBoard logs: tensorboard --logdir " + outcome.tensorboard)
    if outcome.result and outcome.stopped is None:
      print("final evaluation:", values.metrics_text(outcome.result, sep="="))
  if outcome.stopped is not None:  # a retry loop or a job controller starts it again
    signum = interrupts.received() or signal.SIGTERM
    cli.fail(
      f"stopped by {signal.Signals(signum).name} after step {outcome.stopped} of "
      f"{outcome.num_train_steps} (checkpointed); the same command resumes from there",
      code=errors.exit_status(signum),
    )


def _stopped_before(workdir: layout.Workdir, last: int) -> Optional[int]:
  """The step a run that returned stopped at, when that is before its last
  one (a signal, or in a run of several processes another process's
  preemption notice); None for a finished run."""
  newest = ckpt_lib.Checkpointer(workdir, read_only=True).latest_step()
  return newest if newest is not None and newest < last else None


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__)
