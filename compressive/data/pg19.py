"""PG-19 through the TFDS `pg19` builder, with random access to books.

The dataset is prepared once in TFDS's `array_record` format under
`data.pg19.data_dir` and read with `builder.as_data_source(split)`, which gives
book i on demand: the 11 GB train split is never held in memory, only the
books the batch rows are reading (plus the token cache). Record order is
fixed by TFDS when preparing, so document indices are stable.

Raw files: the stock TFDS builder (4.9.x) always reads them from the bucket
gs://deepmind-gutenberg, whatever data_dir says. We use a subclass of it
(same name, version, features and example generation, so the prepared
dataset is the stock one, under `<data_dir>/pg19/0.1.1/`) that reads them
from `data.pg19.raw_dir`, by default that bucket, or a local copy laid out
like it:

    <raw_dir>/metadata.csv        book_id,title,publication_date,link
    <raw_dir>/train/<book_id>.txt
    <raw_dir>/validation/<book_id>.txt
    <raw_dir>/test/<book_id>.txt

Two more differences from the stock builder: metadata.csv is parsed with the
csv module (the stock builder splits on every comma, which breaks quoted
titles that contain one), and `code_path` is None. TFDS 4.9.10 computes the
stock builder's code_path with the `importlib_resources` package, which it
does not declare as a dependency on Python >= 3.9; pg19 downloads nothing
through TFDS's checksummed download manager, so nothing needs that path.

Preparing is done on first use if the data_dir does not hold it yet; in a
multi-host run prepare once beforehand (e.g. by running train_tokenizer.py,
which reads the train split) rather than from every process at once.

Word counts (`num_words`) are `len(text.split())` of each book's text as
stored by TFDS. The paper's word-level perplexity is normalised by the
official word totals of the validation and test splits instead
(`OFFICIAL_WORDS`, the source's `official_words` hook); evaluation compares
the two (compressive/evaluation/evaluate.py).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

from compressive import values
from compressive.data import documents as documents_lib
from compressive.data import registry, tokenizers
from compressive.errors import ConfigError, DataError

if TYPE_CHECKING:
  import tensorflow_datasets as tfds

  from compressive.data.config import DataConfig

BUCKET = "gs://deepmind-gutenberg"
_log = logging.getLogger("compressive")

# The official word totals of PG-19's evaluation splits (Rae et al. 2020,
# Table 2; the "tokens" of DeepMind's pg19 release notes): the normaliser of
# the word-level perplexity quoted for the benchmark, whatever the tokenizer.
# The train split's total (1,973,136,207) is left out: it normalises nothing.
OFFICIAL_WORDS = {"validation": 3_007_061, "test": 6_966_499}


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.pg19`: where the prepared dataset and the raw files are."""

  data_dir: str = values.text("")  # The TFDS data_dir holding (or to hold) the prepared dataset.
  raw_dir: str = values.text("")  # A local copy of the raw bucket; '' = the bucket itself.

  def __post_init__(self) -> None:
    values.check_fields(self, "data.pg19.")


def validate(data_config: "DataConfig") -> None:
  if not data_config.section(Config).data_dir:
    raise ConfigError("data.pg19.data_dir is empty: give the TFDS data_dir for pg19")


def _import(name: str) -> ModuleType:
  """TensorFlow and TFDS are only PG-19's: a missing one is a DataError that
  says how to install them, not a ModuleNotFoundError."""
  import importlib

  try:
    return importlib.import_module(name)
  except ImportError as e:
    raise DataError(
      f"data.source=pg19 needs {name}, which the default install leaves out: "
      f"pip install -r requirements-pg19.txt ({e})"
    ) from None


def read_metadata(path: str) -> dict[int, list[str]]:
  """metadata.csv -> {book_id: [title, publication_date, link]}."""
  tf = _import("tensorflow")

  with tf.io.gfile.GFile(path, "r") as f:
    rows = list(csv.reader(io.StringIO(f.read())))
  out = {}
  for row in rows:
    if not row or not row[0].strip().isdigit():
      continue  # A header line, or blank.
    fields = (row[1:] + ["", "", ""])[:3]
    out[int(row[0])] = fields
  return out


def _local_builder_class(raw_dir: str) -> type[tfds.core.DatasetBuilder]:
  """The stock pg19 builder, reading its raw files from `raw_dir`."""
  tfds = _import("tensorflow_datasets")

  base: Any = tfds.builder_cls("pg19")

  # The base is a class found at run time; mypy checks its keyword against object's.
  class LocalPg19(base, skip_registration=True):  # type: ignore[call-arg]
    name = "pg19"
    # Metadata files (README, citations) of the stock builder's package.
    pkg_dir_path = base._get_pkg_dir_path()
    code_path = None  # See the module docstring.

    # tfds' DownloadManager and SplitGenerators (`tfds` here is the module found at run time)
    def _split_generators(self, dl_manager: Any) -> list[Any]:
      del dl_manager  # Nothing to download.
      metadata_path = os.path.join(raw_dir, "metadata.csv")
      if not tfds.core.Path(metadata_path).exists():
        raise FileNotFoundError(
          f"{metadata_path} not found: data.pg19.raw_dir must hold "
          "metadata.csv and train/, validation/, test/ folders of "
          "<book_id>.txt files, laid out like gs://deepmind-gutenberg"
        )
      metadata = read_metadata(metadata_path)
      generators = []
      for split in registry.SPLITS:
        folder = os.path.join(raw_dir, split)
        if not tfds.core.Path(folder).is_dir():
          raise FileNotFoundError(f"PG-19 raw folder {folder} not found")
        generators.append(
          tfds.core.SplitGenerator(
            name=split, gen_kwargs={"metadata": metadata, "filepath": folder}
          )
        )
      return generators

  return LocalPg19


def get_builder(data_config: "DataConfig") -> "tfds.core.DatasetBuilder":
  """The pg19 builder over data.pg19.data_dir, preparing it if needed."""
  c = data_config.section(Config)
  if not c.data_dir:
    raise DataError(
      "data.source=pg19 needs data.pg19.data_dir, the TFDS data_dir where PG-19 "
      "is (or will be) prepared; set data.pg19.raw_dir too to prepare it "
      "from a local copy of the raw files"
    )
  raw_dir = c.raw_dir or BUCKET
  if not raw_dir.startswith("gs://") and not os.path.isdir(raw_dir):
    raise FileNotFoundError(f"data.pg19.raw_dir {raw_dir!r} is not a folder")
  builder = _local_builder_class(raw_dir)(data_dir=c.data_dir, file_format="array_record")
  if not builder.is_prepared():
    if not registry.may_write():
      raise DataError(
        f"pg19 is not prepared in data.pg19.data_dir={c.data_dir!r}, and a tool that reads a "
        "saved run never prepares it (its config chose the folder): prepare it by training "
        "on this machine, or give the folder where it is prepared"
      )
    _log.info(
      "preparing PG-19 in %s from %s, once (about 11 GB; TFDS reports its progress; "
      "for a run of several processes, prepare it before: docs/SCALING.md)",
      c.data_dir,
      raw_dir,
    )
    builder.download_and_prepare(file_format="array_record")
  return builder


def _as_str(value: object) -> str:
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if hasattr(value, "item"):  # A numpy scalar / 0-d array.
    return _as_str(value.item())
  return str(value)


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.TextDocuments:
  registry.check_split(split)
  builder = get_builder(data_config)
  try:
    source = builder.as_data_source(split)
  except (NotImplementedError, ValueError) as e:
    raise DataError(
      f"PG-19 under {data_config.section(Config).data_dir} cannot be read with random "
      "access; it must be prepared with file_format=array_record (remove "
      f"{builder.data_dir} to prepare it again): {e}"
    ) from e

  def load_text(i: int) -> str:
    return _as_str(source[i]["book_text"])

  def name(i: int) -> str:
    record = source[i]
    return f"{_as_str(record['book_id'])} {_as_str(record['book_title'])}"

  return documents_lib.TextDocuments(
    names=name,
    num_documents=len(source),
    load_text=load_text,
    tokenizer=tokenizer,
    description=f"pg19/{split}",
    cache_tokens=data_config.cache_tokens,
  )


# Prepared by TFDS, whose records get_documents reads on demand: there is
# nothing to check up front short of reading the 11 GB train split.
registry.register(
  registry.Source(
    name="pg19",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    official_words=OFFICIAL_WORDS.get,
    location_fields=("data_dir", "raw_dir"),
  )
)
