"""compressive/files.py, the one way a file is replaced: whole or not at all,
never through a link or a FIFO, a full disk naming the file; and the tools'
one result writer on top of it (cli.save_result)."""

import errno
import json
import os

import pytest

from compressive import cli, cli_os_errors, files


def _only(folder):
  return sorted(os.listdir(folder))


def test_a_file_is_replaced_whole(tmp_path):
  path = str(tmp_path / "a.json")
  files.write_text(path, "old")
  files.write_json(path, {"x": [1, 2]})
  assert json.loads(open(path).read()) == {"x": [1, 2]}
  files.write_bytes(path, b"\x00\x01")
  assert open(path, "rb").read() == b"\x00\x01"
  assert _only(tmp_path) == ["a.json"]  # no temporary file left


def test_the_contents_reach_the_disk_before_the_rename_and_the_rename_after(tmp_path, monkeypatch):
  # The order a power cut needs: the new file's bytes synced, then the
  # rename, then the folder that holds the name synced.
  events = []
  sync, replace = os.fsync, os.replace

  def fsync(fd):
    target = os.readlink(f"/proc/self/fd/{fd}")
    events.append(("fsync", os.path.basename(target), os.path.getsize(target)))
    sync(fd)

  def renamed(src, dst):
    events.append(("replace", os.path.basename(dst)))
    replace(src, dst)

  monkeypatch.setattr(os, "fsync", fsync)
  monkeypatch.setattr(os, "replace", renamed)
  files.write_text(str(tmp_path / "a.json"), "new contents")
  (kind, name, size), rename, folder = events
  assert kind == "fsync" and name.startswith("a.json.tmp") and size == len("new contents")
  assert rename == ("replace", "a.json")
  assert folder[:2] == ("fsync", tmp_path.name)


@pytest.mark.parametrize("crash", [RuntimeError("mid-write"), KeyboardInterrupt()])
def test_a_crash_mid_write_leaves_the_old_file(tmp_path, crash):
  path = str(tmp_path / "a.txt")
  files.write_text(path, "old contents")
  with pytest.raises(type(crash)):
    with files.replacing(path) as f:
      f.write("half of the new")
      f.flush()  # on the disk, in the temporary file
      raise crash
  assert open(path).read() == "old contents"
  assert _only(tmp_path) == ["a.txt"]


def test_a_rename_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
  path = str(tmp_path / "a.txt")
  files.write_text(path, "old")

  def refused(src, dst):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), src, None, dst)

  monkeypatch.setattr(files.os, "replace", refused)
  with pytest.raises(OSError):
    files.write_text(path, "new")
  assert open(path).read() == "old" and _only(tmp_path) == ["a.txt"]


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
  outside = tmp_path / "outside.txt"
  outside.write_text("not yours")
  (tmp_path / "wd").mkdir()
  path = tmp_path / "wd" / "config.json"
  os.symlink(outside, path)
  files.write_text(str(path), "new")
  assert not path.is_symlink() and path.read_text() == "new"
  assert outside.read_text() == "not yours"


def test_whatever_holds_the_temporary_name_is_never_followed_or_waited_on(tmp_path, monkeypatch):
  outside = tmp_path / "outside.txt"
  outside.write_text("not yours")
  (tmp_path / "wd").mkdir()
  path = str(tmp_path / "wd" / "metrics.jsonl")
  names = iter(["link", "fifo", "file", "free"])
  monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
  planted = lambda name: f"{path}.tmp{os.getpid()}.{name}"  # noqa: E731
  os.symlink(outside, planted("link"))
  os.mkfifo(planted("fifo"))  # an open() of it for writing would wait for a reader
  open(planted("file"), "w").write("someone's")
  files.write_text(path, "new")
  assert open(path).read() == "new" and outside.read_text() == "not yours"
  assert os.path.islink(planted("link")) and open(planted("file")).read() == "someone's"
  assert not os.path.lexists(planted("free"))  # renamed into place


def test_a_full_disk_names_the_file_and_leaves_the_old_one(tmp_path):
  path = str(tmp_path / "a.txt")
  files.write_text(path, "old")
  with pytest.raises(OSError) as e:
    with files.replacing(path) as f:
      f.write("x")
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write's, naming no file
  assert e.value.errno == errno.ENOSPC and e.value.filename.startswith(path + ".tmp")
  assert cli_os_errors.describe_os_error(e.value).startswith(f"cannot write {path}.tmp")
  assert open(path).read() == "old" and _only(tmp_path) == ["a.txt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_write_the_disk_refuses_at_close_names_the_file(tmp_path, monkeypatch):
  # Python's buffered file flushes on close: the ENOSPC comes from there.
  path = str(tmp_path / "a.bin")
  create = files._create_beside

  def on_a_full_disk(target, mode):
    tmp, fd = create(target, mode)
    os.close(fd)
    return tmp, os.open("/dev/full", os.O_WRONLY)

  monkeypatch.setattr(files, "_create_beside", on_a_full_disk)
  with pytest.raises(OSError) as e:
    files.write_bytes(path, b"model")
  assert e.value.errno == errno.ENOSPC and e.value.filename.startswith(path + ".tmp")
  assert _only(tmp_path) == []


def test_json_with_nan_is_refused_before_anything_is_written(tmp_path):
  path = str(tmp_path / "r.json")
  with pytest.raises(ValueError):
    files.write_json(path, {"loss": float("nan")})
  assert _only(tmp_path) == []


# -- cli.save_result: the tools' results. --------------------------------------------


def test_a_result_is_saved_whole(tmp_path):
  path = str(tmp_path / "eval_test_step2.json")
  assert cli.save_result({"step": 2, "bits_per_byte": 1.25}, path) is None
  assert json.loads(open(path).read()) == {"step": 2, "bits_per_byte": 1.25}


def test_a_result_that_cannot_be_saved_is_one_warning_naming_its_path(tmp_path):
  path = tmp_path / "eval_test_step2.json"
  path.mkdir()  # a folder in the file's place
  warning = cli.save_result({"step": 2}, str(path), lambda p: p.replace(str(tmp_path), "gs://b"))
  assert warning is not None and "\n" not in warning
  assert warning.startswith("the result is printed but not saved: cannot write gs://b/eval_")
  assert _only(tmp_path) == ["eval_test_step2.json"] and path.is_dir()


def test_a_result_with_nan_is_not_saved(tmp_path):
  path = str(tmp_path / "r.json")
  with pytest.raises(ValueError):
    cli.save_result({"loss": float("inf")}, path)
  assert _only(tmp_path) == []
