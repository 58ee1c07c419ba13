"""train.py as a function of its arguments (compressive/train.py `run`):
what the command does, called directly with `Args`, its errors raised as
exceptions, and the stop signals' handlers and absl's flags left as they
were found. The command line's own
questions (one line, exit 2) are tests/tools/test_entry_point_errors.py's."""

import json
import signal

from absl import flags
import pytest

from compressive import train as train_tool
from compressive.errors import ConfigError
from compressive.training import layout
from helpers import tiny_experiment


@pytest.mark.slow
def test_run_trains_resumes_and_reports_without_the_command_line(tmp_path):
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
  workdir = str(tmp_path / "wd")
  config = tiny_experiment(num_train_steps=4, checkpoint_every_steps=2, eval_every_steps=4)
  outcome = train_tool.run(train_tool.Args(config=config, workdir=workdir))
  assert (outcome.printed, outcome.stopped, outcome.num_train_steps) == (None, None, 4)
  assert outcome.result and "loss" in outcome.result
  assert outcome.tensorboard == layout.Workdir(workdir).tensorboard()
  assert layout.Workdir(workdir).checkpoints  # the run's files, where the command writes them
  assert {s: signal.getsignal(s) for s in handlers} == handlers
  # The same arguments again: the run is finished, nothing is trained.
  again = train_tool.run(train_tool.Args(config=config, workdir=workdir))
  assert again.result == {} and again.stopped is None


def test_run_prints_checks_and_refuses_as_the_command_would(tmp_path):
  config = tiny_experiment(num_train_steps=4)
  printed = train_tool.run(train_tool.Args(config=config, workdir=None, print_config=True))
  assert json.loads(printed.printed or "")["num_train_steps"] == 4
  workdir = tmp_path / "wd"
  dry = train_tool.run(train_tool.Args(config=config, workdir=str(workdir), dry_run=True))
  assert (dry.printed or "").startswith(f"dry run: would start {workdir} afresh")
  assert not workdir.exists()  # nothing written
  with pytest.raises(ConfigError, match=r"--profile_steps=5,6 starts after the run's last step"):
    train_tool.run(train_tool.Args(config=config, workdir=str(workdir), profile_steps=(5, 6)))
  with pytest.raises(ConfigError, match="--workdir is required"):
    train_tool.run(train_tool.Args(config=config, workdir=None))


def test_importing_the_tool_defines_no_flag():
  # Its flags are the command's (define_flags, run as __main__): a caller
  # of `run` and a test in the same process keep absl's flags as they were.
  assert "restore_intact" not in flags.FLAGS and "dry_run" not in flags.FLAGS
