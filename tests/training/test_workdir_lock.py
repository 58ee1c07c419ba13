"""The workdir lock cannot be fooled (in-process; the two-trainer test with
train.py processes is in test_robustness.py).

One trainer per workdir, and one run per checkpoints folder: not undone by
deleting train.lock, by a link or anything else in its place, by reaching
the workdir through a link, or by a second workdir whose checkpoints/ is
the same folder. Whatever is in train.lock's place is never followed,
truncated or written through: it is set aside, and a lock file of the
trainer's own takes its place.
"""

import os
import shutil
import socket

import pytest

from compressive import files
from compressive.errors import UserError
from compressive.training import layout, sidefiles
from compressive.training import loop as train_lib
from compressive.training.layout import LOCK_FILE, OWNER_FILE
from compressive.training.lock import WorkdirBusyError, WorkdirLock
from helpers import tiny_experiment, to_train

BUSY = r"in use by another trainer \(pid \d+ on host"


def held(workdir):
  return WorkdirLock(str(workdir)).acquire()


def assert_busy(workdir, match=BUSY):
  with pytest.raises(WorkdirBusyError, match=match) as e:
    held(workdir)
  assert "\n" not in str(e.value)
  return str(e.value)


def assert_free(workdir):
  held(workdir).release()


def record_of(workdir):
  path = os.path.join(workdir, LOCK_FILE)
  assert os.path.isfile(path) and not os.path.islink(path)
  return open(path, encoding="utf-8").read()


def set_aside(workdir):
  return sorted(n for n in os.listdir(workdir) if n.startswith(LOCK_FILE + "."))


def test_deleting_the_lock_file_does_not_free_the_workdir(tmp_path):
  # What people do about a lock they believe stale: the trainer still holds it.
  lock = held(tmp_path)
  os.remove(tmp_path / LOCK_FILE)
  message = assert_busy(tmp_path)
  assert f"pid {os.getpid()} on host {socket.gethostname()}" in message  # the holder, still named
  lock.release()
  assert_free(tmp_path)  # once released (or its process died): free, with no file to delete


def _outside_file(tmp_path):
  target = tmp_path / "precious.txt"
  target.write_text("a user's file\n")
  return target


def _link(tmp_path, wd):
  os.symlink(_outside_file(tmp_path), wd / LOCK_FILE)
  return [tmp_path / "precious.txt"]


def _dangling_link(tmp_path, wd):
  os.symlink(tmp_path / "created_by_nobody", wd / LOCK_FILE)
  return []


def _hard_link(tmp_path, wd):
  os.link(_outside_file(tmp_path), wd / LOCK_FILE)
  return [tmp_path / "precious.txt"]


def _folder(tmp_path, wd):
  os.makedirs(wd / LOCK_FILE)
  (wd / LOCK_FILE / "notes.txt").write_text("a user's file\n")
  return []


def _fifo(tmp_path, wd):
  os.mkfifo(wd / LOCK_FILE)
  return []


@pytest.mark.parametrize(
  "make",
  [_link, _dangling_link, _hard_link, _folder, _fifo],
  ids=["link", "dangling-link", "hard-link", "folder", "fifo"],
)
def test_anything_but_a_file_of_its_own_in_the_lock_files_place_is_set_aside(tmp_path, make):
  wd = tmp_path / "wd"
  os.makedirs(wd)
  outside = make(tmp_path, wd)
  lock = held(wd)  # no hang (a FIFO), no error (a folder): it is set aside
  try:
    # Nothing outside the workdir was followed, created, truncated or written.
    for path in outside:
      assert path.read_text() == "a user's file\n"
    assert not os.path.lexists(tmp_path / "created_by_nobody")
    assert record_of(wd).startswith(f"pid {os.getpid()} on host ")
    assert os.stat(wd / LOCK_FILE).st_nlink == 1
    aside = set_aside(wd)
    assert len(aside) == 1, aside  # kept, under another name
    if make is _folder:
      assert (wd / aside[0] / "notes.txt").read_text() == "a user's file\n"
    assert_busy(wd)  # and the lock holds
  finally:
    lock.release()
  assert_free(wd)


def test_a_workdir_reached_through_a_link_is_the_same_workdir(tmp_path):
  os.makedirs(tmp_path / "wd")
  os.symlink(tmp_path / "wd", tmp_path / "alias")
  with WorkdirLock(str(tmp_path / "alias")):
    assert_busy(tmp_path / "wd")
    os.remove(tmp_path / "wd" / LOCK_FILE)
    assert_busy(tmp_path / "wd")
  with WorkdirLock(str(tmp_path / "wd")):
    assert_busy(tmp_path / "alias")


@pytest.mark.parametrize("linked", ["second", "first"])
def test_a_checkpoints_folder_belongs_to_one_run(tmp_path, linked):
  first, second = tmp_path / "first", tmp_path / "second"
  os.makedirs(first)
  os.makedirs(second)
  if linked == "second":  # the second run's checkpoints/ is a link to the running one's
    lock = held(first)  # (which the lock creates, to hold it)
    os.symlink(first / "checkpoints", second / "checkpoints")
  else:  # the running run's checkpoints/ is a link to the second's
    os.makedirs(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", first / "checkpoints")
    lock = held(first)
    os.symlink(tmp_path / "elsewhere", second / "checkpoints")
  message = assert_busy(second, match="checkpoints")
  assert "belongs to one run" in message and f"pid {os.getpid()}" in message
  assert os.path.realpath(first / "checkpoints") in message
  lock.release()
  with pytest.raises(UserError, match="holds the run of another workdir"):  # after it too
    held(second)
  os.remove(second / "checkpoints")
  assert_free(second)  # the refusals kept no lock of their own behind
  assert_free(first)


def test_the_trainer_refuses_another_runs_checkpoints_before_it_writes(tmp_path):
  # In process, as train.py: nothing is read, compiled or written there.
  first, second = tmp_path / "first", tmp_path / "second"
  os.makedirs(first)
  os.makedirs(second)
  with WorkdirLock(str(first)):
    os.symlink(first / "checkpoints", second / "checkpoints")
    with pytest.raises(WorkdirBusyError, match="belongs to one run"):
      train_lib.train_and_evaluate(to_train(tiny_experiment()), str(second))
  assert os.listdir(first / "checkpoints") == [OWNER_FILE]
  assert sorted(os.listdir(second)) == ["checkpoints", LOCK_FILE]


def test_a_lock_file_held_by_an_earlier_trainer_still_keeps_the_workdir(tmp_path):
  # Trainers of earlier versions lock only train.lock: they keep theirs.
  import fcntl

  fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"pid 1 on host elsewhere\n")
    assert f"pid {os.getpid()} on host" in assert_busy(tmp_path)
  finally:
    os.close(fd)
  assert_free(tmp_path)


@pytest.mark.parametrize(
  "make,cause",
  [
    (lambda wd: (wd / "checkpoints").write_text("a user's file\n"), "is not a folder"),
    (lambda wd: os.symlink(wd / "gone", wd / "checkpoints"), "which does not exist"),
  ],
  ids=["file", "dangling-link"],
)
def test_checkpoints_that_are_no_folder_are_one_line_and_left_alone(tmp_path, make, cause):
  from compressive.errors import UserError

  make(tmp_path)
  with pytest.raises(UserError, match=cause) as e:
    held(tmp_path)
  assert "\n" not in str(e.value) and not isinstance(e.value, WorkdirBusyError)
  assert os.path.lexists(tmp_path / "checkpoints") and not os.path.exists(tmp_path / "gone")
  with pytest.raises(UserError, match=cause):  # the same line again, not "busy": no lock kept
    held(tmp_path)


def test_a_running_runs_folders_are_no_other_runs_workdir_or_checkpoints(tmp_path):
  first, second = tmp_path / "first", tmp_path / "second"
  os.makedirs(first)
  os.makedirs(second)
  os.symlink(first, second / "checkpoints")  # checkpoints into the running run's workdir
  with WorkdirLock(str(first)):
    assert_busy(first / "checkpoints")  # its checkpoints folder as a workdir
    assert_busy(second, match="belongs to one run")
  assert os.listdir(first / "checkpoints") == [OWNER_FILE]


# -- A workdir's files are its own, one run after the other too. ------------------


def test_a_checkpoints_folder_of_a_finished_run_is_no_other_workdirs(tmp_path):
  # runs/a trains and stops; runs/b, whose checkpoints/ is a link to a's,
  # would "resume" a's run and write into it: refused, by name.
  a, b = tmp_path / "a", tmp_path / "b"
  os.makedirs(a)
  os.makedirs(b)
  assert_free(a)
  os.symlink(a / "checkpoints", b / "checkpoints")
  with pytest.raises(
    UserError,
    match=r"holds the run of another workdir \(.*/a\); a "
    r"checkpoints folder belongs to one run",
  ) as e:
    held(b)
  assert "\n" not in str(e.value)
  assert_free(a)  # a resumes as before
  # The same when the folder lives elsewhere and both link to it.
  os.makedirs(tmp_path / "store")
  c, d = tmp_path / "c", tmp_path / "d"
  for wd in (c, d):
    os.makedirs(wd)
    os.symlink(tmp_path / "store", wd / "checkpoints")
  assert_free(c)
  with pytest.raises(UserError, match="holds the run of another workdir"):
    held(d)
  # Its way out, when d is c moved: the record removed, d claims the folder.
  os.remove(tmp_path / "store" / OWNER_FILE)
  assert_free(d)
  with pytest.raises(UserError, match=r"another workdir \(.*/d\)"):
    held(c)


def hard_linked_copy(source, target):
  """What `cp -al SOURCE TARGET` makes: new folders, every file a hard link
  to the source's (links copied as links)."""
  shutil.copytree(source, target, symlinks=True, copy_function=os.link)


@pytest.mark.parametrize("how", ["copied", "moved", "hard-linked copy"])
def test_a_workdir_copied_or_moved_whole_keeps_its_run(tmp_path, how):
  a = tmp_path / "a"
  os.makedirs(a)
  assert_free(a)
  copy = tmp_path / "copy"
  if how == "copied":
    shutil.copytree(a, copy)
  elif how == "moved":
    os.rename(a, copy)
  else:
    hard_linked_copy(a, copy)
  assert_free(copy)
  if how != "moved":
    assert_free(a)  # each its own: the copy's record is its own file


def test_checkpoints_that_are_the_workdir_itself_are_one_line(tmp_path):
  os.symlink(".", tmp_path / "checkpoints")
  with pytest.raises(UserError, match="is the workdir itself") as e:
    held(tmp_path)
  assert f"pid {os.getpid()}" not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", layout.SIDE_FILES)
def test_a_side_file_of_a_hard_linked_copy_is_never_written_through(tmp_path, name):
  # cp -al (a cheap fork, rsync --link-dest): the copy's side files are the
  # original's inodes until the copy's trainer makes them its own.
  a, b = tmp_path / "a", tmp_path / "b"
  os.makedirs(a)
  (a / name).write_text("a's line\n")
  hard_linked_copy(a, b)
  sidefiles.prepare(str(b))
  fd = files.open_regular(str(b / name), os.O_WRONLY | os.O_APPEND)
  with os.fdopen(fd, "a") as f:
    f.write("b's line\n")
  assert (a / name).read_text() == "a's line\n"
  assert (b / name).read_text() == "a's line\nb's line\n"
  assert os.stat(a / name).st_nlink == os.stat(b / name).st_nlink == 1


def test_a_start_that_fails_before_the_run_begins_leaves_no_stub(tmp_path):
  # Fourteen files for a batch of 16 rows: the data's one line, and the
  # workdir the start created is gone again (no checkpoints/, train.lock or
  # empty train.log left to puzzle over); a workdir that was there stays.
  texts = tmp_path / "texts"
  texts.mkdir()
  for i in range(14):
    (texts / f"t{i}.txt").write_text(f"text {i} " * 40)
  config = tiny_experiment(
    **{"data.source": "text_files", "data.text_files.path": str(texts), "batch_size": 16}
  )
  with pytest.raises(UserError, match="documents but the batch has 16 rows"):
    train_lib.train_and_evaluate(to_train(config), str(tmp_path / "new"))
  assert not os.path.lexists(tmp_path / "new")
  os.makedirs(tmp_path / "mine")
  with pytest.raises(UserError, match="documents but the batch has 16 rows"):
    train_lib.train_and_evaluate(to_train(config), str(tmp_path / "mine"))
  assert os.path.isdir(tmp_path / "mine")
