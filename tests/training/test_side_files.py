"""Side files (config.json, train.log, the metrics files, TensorBoard's
folders) are only ever read when they are regular files, and only up to a
bound; anything else in their place (a folder, a FIFO whose open() would
wait forever, a link out of the workdir) is set aside by the trainer and
refused in one line by a reader, and never blocks a resume. A write the
disk refuses names its file."""

import contextlib
import errno
import json
import logging
import os
import shutil
import signal

import pytest

import compressive
from compressive import cli_os_errors, files
from compressive.errors import CheckpointError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import loop as train_lib
from compressive.training import metrics, runconfig, runlog, sidefiles
from helpers import checked, tiny_experiment, to_train


@contextlib.contextmanager
def no_waiting(seconds=60):
  """A FIFO's open() waits forever on the old code: fail instead."""

  def expire(signum, frame):
    raise TimeoutError("blocked: a side file's open() waited")

  old = signal.signal(signal.SIGALRM, expire)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def put(path, kind, outside):
  """Puts a `kind` thing at `path`: a folder, a FIFO, or a link to `outside`
  (a file or folder out of the workdir)."""
  if kind == "folder":
    os.makedirs(path)
    (open(os.path.join(path, "kept"), "w")).write("mine")
  elif kind == "FIFO":
    os.mkfifo(path)
  else:
    os.symlink(outside, path)


def outside_things(tmp_path):
  outside = tmp_path / "outside"
  (outside / "folder").mkdir(parents=True)
  (outside / "file").write_text("not the run's\n")
  return outside


# What the trainer does with each side file, in the order it does it:
# sidefiles.prepare, then the writer or reader of that file.
def use_config(wd):
  runconfig.check_resume_config(wd, checked(tiny_experiment()))
  runconfig.save_config(wd, checked(tiny_experiment()))
  assert runconfig.load_config(wd).model.d_model == tiny_experiment().model.d_model


def use_log(wd):
  handler = runlog.add_log_file(wd)
  logging.getLogger("compressive").removeHandler(handler)
  handler.emit(logging.LogRecord("compressive", logging.INFO, "", 0, "a line", (), None))
  handler.close()
  assert open(os.path.join(wd, "train.log")).read().count("a line") == 1


def use_metrics(name):
  def use(wd):
    path = os.path.join(wd, name)
    runlog.truncate_metrics(path, 3)
    metrics.append_line(path, '{"step": 1}')
    assert metrics.read_jsonl(path) == [{"step": 1}]

  return use


def use_tensorboard(wd):
  writer = metrics.MetricWriter(wd, "train")
  writer.write(1, {"loss": 1.0})
  writer.close()
  assert len(os.listdir(os.path.join(wd, "tensorboard", "train"))) == 1


SIDE_FILES = [
  ("config.json", use_config),
  ("train.log", use_log),
  ("metrics_train.jsonl", use_metrics("metrics_train.jsonl")),
  ("metrics_eval.jsonl", use_metrics("metrics_eval.jsonl")),
  ("tensorboard", use_tensorboard),
  (os.path.join("tensorboard", "train"), use_tensorboard),
]


@pytest.mark.parametrize("kind", ["folder", "FIFO", "link"])
@pytest.mark.parametrize("name,use", SIDE_FILES, ids=[n for n, _ in SIDE_FILES])
def test_anything_but_a_file_in_a_side_files_place_is_set_aside(tmp_path, name, use, kind):
  outside = outside_things(tmp_path)
  wd = tmp_path / "wd"
  path = wd / name
  path.parent.mkdir(parents=True)
  is_folder = name.startswith("tensorboard")
  if is_folder and kind == "folder":  # a folder is right here: a file is wrong
    path.write_text("in the way")
  else:
    put(str(path), kind, str(outside / ("folder" if is_folder else "file")))
  with no_waiting():
    sidefiles.prepare(str(wd))
    use(str(wd))
  aside = wd / (name + ".aside")
  assert os.path.lexists(aside)  # kept, not deleted
  if kind == "folder" and not is_folder:
    assert (aside / "kept").read_text() == "mine"
  # Nothing was written through a link, out of the workdir.
  assert (outside / "file").read_text() == "not the run's\n"
  assert os.listdir(outside / "folder") == []


@pytest.mark.parametrize("kind", ["folder", "FIFO", "link"])
def test_a_reader_refuses_a_config_json_that_is_not_a_file_in_one_line(tmp_path, kind):
  outside = outside_things(tmp_path)
  wd = tmp_path / "wd"
  wd.mkdir()
  # a config, but elsewhere
  runconfig.save_config(str(outside / "folder"), checked(tiny_experiment()))
  put(str(wd / "config.json"), kind, str(outside / "folder" / "config.json"))
  with no_waiting(), pytest.raises(CheckpointError, match=rf"config.json is a {kind}, not a file"):
    runconfig.load_config(str(wd))
  with no_waiting(), pytest.raises(CheckpointError, match="not a file"):
    compressive.load(str(wd))
  assert sorted(os.listdir(wd)) == ["config.json"]  # readers never write


def test_side_files_are_read_only_up_to_a_bound(tmp_path, monkeypatch, caplog):
  wd = tmp_path / "wd"
  runconfig.save_config(str(wd), checked(tiny_experiment()))
  path = wd / "metrics_train.jsonl"
  path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 50)))
  monkeypatch.setattr(sidefiles, "CONFIG_BYTES", 64)
  monkeypatch.setattr(sidefiles, "METRICS_BYTES", 256)
  with pytest.raises(CheckpointError, match="config.json is larger than"):
    runconfig.load_config(str(wd))
  with pytest.raises(CheckpointError, match="metrics_train.jsonl is larger than"):
    metrics.read_jsonl(str(path))
  with caplog.at_level(logging.WARNING, logger="compressive"):
    runlog.truncate_metrics(str(path), 3)  # the trainer's resume: set aside, started again
    runconfig.check_resume_config(str(wd), checked(tiny_experiment()))
  assert not path.exists() and len((wd / "metrics_train.jsonl.aside").read_text()) > 256
  assert (wd / "config.json.damaged").exists() and not (wd / "config.json").exists()


@pytest.mark.slow
def test_a_resume_goes_on_past_side_files_that_are_not_files(tmp_path):
  config = tiny_experiment(
    **{
      "num_train_steps": 4,
      "checkpoint_every_steps": 2,
      "eval_every_steps": 2,
      "log_every_steps": 1,
    }
  )
  wd = tmp_path / "wd"
  train_lib.train_and_evaluate(to_train(config), str(wd), stop_at_step=2)
  outside = outside_things(tmp_path)
  for name in ("metrics_train.jsonl", "config.json", os.path.join("tensorboard", "train")):
    path = wd / name
    if path.is_dir():
      shutil.rmtree(path)
    else:
      os.remove(path)
  put(str(wd / "metrics_train.jsonl"), "folder", None)
  put(str(wd / "metrics_eval.jsonl.new"), "FIFO", None)
  os.replace(wd / "metrics_eval.jsonl.new", wd / "metrics_eval.jsonl")
  os.replace(wd / "train.log", wd / "train.log.old")
  put(str(wd / "train.log"), "FIFO", None)
  put(str(wd / "config.json"), "link", str(outside / "file"))
  put(str(wd / "tensorboard" / "train"), "link", str(outside / "folder"))
  with no_waiting(600):
    train_lib.train_and_evaluate(to_train(config), str(wd))
  assert ckpt_lib.Checkpointer(str(wd), read_only=True).all_steps() == [2, 4]
  assert [r["step"] for r in metrics.read_jsonl(str(wd / "metrics_train.jsonl"))] == [3, 4]
  for name in (
    "metrics_train.jsonl",
    "metrics_eval.jsonl",
    "train.log",
    "config.json",
    os.path.join("tensorboard", "train"),
  ):
    assert os.path.lexists(wd / (name + ".aside")), name
  assert (outside / "file").read_text() == "not the run's\n"
  assert os.listdir(outside / "folder") == []


# -- A write the disk refuses names its file. -----------------------------------------


def full_disk_stream():
  """A file object whose every write and flush fails as a full disk does:
  an OSError that names no file."""

  class Full:
    def write(self, data):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    flush = close = lambda self: self.write("")

  return Full()


def test_a_full_disk_under_train_log_is_one_warning_naming_it(tmp_path, capsys):
  handler = runlog.add_log_file(str(tmp_path))
  logging.getLogger("compressive").removeHandler(handler)
  handler.stream = full_disk_stream()
  for _ in range(3):
    handler.emit(logging.LogRecord("compressive", logging.INFO, "", 0, "a line", (), None))
  handler.close()  # the old code raised here: `cannot write: No space left on device`
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and f"cannot write {tmp_path / 'train.log'}" in err[0], err


def test_a_full_disk_under_config_json_names_the_file(tmp_path, monkeypatch):
  create = files._create_beside

  def on_a_full_disk(path, mode):  # the temporary file made, its writes going to /dev/full
    tmp, fd = create(path, mode)
    os.close(fd)
    return tmp, os.open("/dev/full", os.O_WRONLY)

  monkeypatch.setattr(files, "_create_beside", on_a_full_disk)
  with pytest.raises(OSError) as e:
    runconfig.save_config(str(tmp_path), checked(tiny_experiment()))
  message = cli_os_errors.describe_os_error(e.value)
  assert message.startswith(f"cannot write {tmp_path / 'config.json'}.tmp"), message
  assert not os.listdir(tmp_path)


# -- Whatever fails to parse is damage, set aside. -----------------------------


DEEP = "[" * 100_000 + "]" * 100_000  # past Python's recursion: RecursionError
BIG_INT = "9" * 4301  # past Python's int-string limit: ValueError


@pytest.mark.parametrize(
  "text",
  [
    DEEP,
    '{"seed": ' + BIG_INT + "}",
    '{"model.num_layers": 2}',
    '{"model": {"x": ' + "[" * 900 + "]" * 900 + "}}",
    '\ufeff{"seed": 0}',
    "[1, 2]",
  ],
  ids=[
    "nested 100,000 deep",
    "an int of 4,301 digits",
    "a key with a dot",
    "a field 900 deep",
    "a UTF-8 BOM",
    "a list",
  ],
)
def test_a_config_json_that_cannot_be_parsed_is_set_aside_by_a_resume(tmp_path, caplog, text):
  wd = tmp_path / "wd"
  wd.mkdir()
  (wd / "config.json").write_text(text)
  with caplog.at_level(logging.WARNING, logger="compressive"):
    runconfig.check_resume_config(str(wd), checked(tiny_experiment()))
  assert (wd / "config.json.damaged").read_text() == text and not (wd / "config.json").exists()
  assert "config.json is damaged" in caplog.text and "set aside" in caplog.text


@pytest.mark.parametrize(
  "line",
  [
    DEEP,
    '{"step": 2, "loss": ' + BIG_INT + "}",
    '[{"step": 2}]',
    '{"step": true}',
    '{"step": 2, "x": ' + "[" * 900 + "]" * 900 + "}",
  ],
  ids=[
    "nested 100,000 deep",
    "an int of 4,301 digits",
    "a list",
    "a step of true",
    "a field 900 deep",
  ],
)
def test_a_metrics_line_that_cannot_be_parsed_is_left_out_by_a_resume(tmp_path, caplog, line):
  path = tmp_path / "metrics_train.jsonl"
  path.write_text('{"step": 1, "loss": 1.5}\n' + line + '\n{"step": 3, "loss": 1.25}\n')
  with caplog.at_level(logging.WARNING, logger="compressive"):
    assert metrics.read_jsonl(str(path)) == [{"step": 1, "loss": 1.5}, {"step": 3, "loss": 1.25}]
    runlog.truncate_metrics(str(path), 5)
  assert "line(s) 2 are not whole records" in caplog.text
  assert path.read_text() == '{"step": 1, "loss": 1.5}\n{"step": 3, "loss": 1.25}\n'


def test_non_finite_numbers_in_a_metrics_file_read_as_null_and_stay_valid_json(tmp_path):
  # Files of older versions wrote NaN; a float beyond 1.8e308 overflows.
  path = tmp_path / "metrics_train.jsonl"
  path.write_text('{"step": 1, "loss": NaN}\n{"step": 2, "loss": 1e999, "x": -Infinity}\n')
  assert metrics.read_jsonl(str(path)) == [
    {"step": 1, "loss": None},
    {"step": 2, "loss": None, "x": None},
  ]
  runlog.truncate_metrics(str(path), 5)

  def refuse(constant):
    raise ValueError(constant)

  assert [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()] == [
    {"step": 1, "loss": None},
    {"step": 2, "loss": None, "x": None},
  ]
