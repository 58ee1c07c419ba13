"""Documents from a Hugging Face `datasets` dataset, a text column's value
per record, one document each (`data.source=hf_datasets`; the `datasets`
extra).

`data.hf_datasets.path` is a folder that `Dataset.save_to_disk` or
`DatasetDict.save_to_disk` wrote (read with `datasets.load_from_disk`), or
else what `datasets.load_dataset` takes: a dataset's name on the Hub, a
local folder of data files (`train.jsonl`, `test.parquet`, ...) or a
loading script; `data.hf_datasets.name` its configuration ('' for none).
By name, the dataset is downloaded once into the `datasets` cache
(HF_HOME, HF_DATASETS_CACHE and HF_DATASETS_OFFLINE apply); a tool that
reads a saved run only reads that cache.

The dataset's splits: each of ours (train, validation, test) is the
dataset's split that `data.hf_datasets.splits` names in its place (by
default the same names). A dataset of one split (a `Dataset`, or a
`DatasetDict` with one split) is split by a hash of its records' names
(`train:17`, documents.split_by_hash with heldout_fraction), as one
text file's pieces are. `data.hf_datasets.text_column` names the column
that holds each document, a string. Records are read by index, as stored.
`check_documents` reads every record of a split once (a value that is not
a string, or a text of fewer than 2 tokens, is one line naming the
record). A resume compares the dataset's fingerprints (`datasets`' digest
of each split's content) with those it was saved on.

Config (`config.data.hf_datasets`): path, name (''), text_column ('text'),
splits (registry.SPLITS: our own names), heldout_fraction (0.05).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

from compressive import values
from compressive.data import documents as documents_lib
from compressive.data import registry, tokenizers
from compressive.errors import ConfigError, DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.hf_datasets`: which dataset, which column, which of its splits."""

  path: str = ""  # A save_to_disk folder, or a name for datasets.load_dataset.
  name: str = ""  # The dataset's configuration (load_dataset's `name`); '' for none.
  text_column: str = "text"  # The column holding each document's text.
  # The dataset's split read as each of ours (train, validation, test).
  splits: tuple = registry.SPLITS
  # Held-out share of records for each of validation and test when a
  # dataset of one split is split by hash.
  heldout_fraction: float = 0.05


def validate(data_config: "DataConfig") -> None:
  c = data_config.section(Config)
  if not isinstance(c.path, str) or not c.path:
    raise ConfigError(
      "data.hf_datasets.path is empty: give a folder save_to_disk wrote, or a "
      "dataset name for datasets.load_dataset"
    )
  for field in ("name", "text_column"):
    if not isinstance(getattr(c, field), str):
      raise ConfigError(f"data.hf_datasets.{field}={getattr(c, field)!r} must be a string")
  if not c.text_column:
    raise ConfigError("data.hf_datasets.text_column is empty: name the column holding the text")
  splits = tuple(c.splits)
  if len(splits) != len(registry.SPLITS) or not all(isinstance(s, str) and s for s in splits):
    raise ConfigError(
      f"data.hf_datasets.splits={splits} must be {len(registry.SPLITS)} split "
      f"names of the dataset, read as {', '.join(registry.SPLITS)}"
    )
  values.number("data.hf_datasets.heldout_fraction", c.heldout_fraction, "(0, 0.5)")


def _datasets() -> ModuleType:
  try:
    import datasets
  except ImportError:
    raise DataError(
      "data.source=hf_datasets needs the datasets package: pip install "
      '"compressive[datasets]" (or pip install datasets)'
    ) from None
  return datasets


def _saved(path: str) -> bool:
  """Whether `path` is a folder save_to_disk wrote (a Dataset's or a DatasetDict's)."""
  return any(os.path.isfile(os.path.join(path, n)) for n in ("dataset_dict.json", "state.json"))


@functools.lru_cache(maxsize=4)
def _load(path: str, name: str, may_download: bool) -> dict[str, Any]:
  """{split name: Dataset} of the dataset (a lone Dataset as {'': it})."""
  datasets = _datasets()
  what = f"data.hf_datasets.path={path!r}" + (f" (name {name!r})" if name else "")
  try:
    if os.path.isdir(path) and _saved(path):
      loaded = datasets.load_from_disk(path)
    else:
      download = None if may_download else datasets.DownloadConfig(local_files_only=True)
      loaded = datasets.load_dataset(path, name or None, download_config=download)
  except Exception as e:  # datasets' own errors (not found, no network, a bad file): the input's
    raise DataError(
      f"{what}: cannot load it ({type(e).__name__}: {' '.join(str(e).split())[:300]})"
    ) from None
  if isinstance(loaded, datasets.Dataset):
    return {"": loaded}
  return dict(loaded)


def _dataset(c: Config) -> dict[str, Any]:
  return _load(c.path, c.name, registry.may_write())


def _rows(c: Config, split: str) -> tuple[Any, list[int], str]:
  """(the dataset split read as `split`, the indices of its records in it,
  its name in the dataset)."""
  registry.check_split(split)
  loaded = _dataset(c)
  if len(loaded) == 1:  # one split: cut by hash
    [(name, data)] = loaded.items()
    label = name or "records"
    chosen = documents_lib.split_by_hash(
      [f"{label}:{i}" for i in range(len(data))], c.heldout_fraction
    )[split]
    return data, chosen, label
  wanted = tuple(c.splits)[registry.SPLITS.index(split)]
  if wanted not in loaded:
    raise DataError(
      f"data.hf_datasets.path={c.path!r} has no split {wanted!r} (read as "
      f"{split}); its splits: {', '.join(loaded)}; choose three with "
      f"data.hf_datasets.splits"
    )
  return loaded[wanted], list(range(len(loaded[wanted]))), wanted


def _column(data: Any, c: Config, where: str) -> Any:
  if c.text_column not in data.column_names:
    raise DataError(
      f"{where} has no column {c.text_column!r} (data.hf_datasets.text_column); "
      f"its columns: {', '.join(data.column_names[:20])}"
    )
  return data.select_columns([c.text_column])


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.TextDocuments:
  c = data_config.section(Config)
  data, chosen, label = _rows(c, split)
  column = _column(data, c, f"data.hf_datasets.path={c.path!r} split {label!r}")

  def text(i: int) -> str:
    value = column[int(chosen[i])][c.text_column]
    if not isinstance(value, str):
      raise DataError(
        f"{label}:{chosen[i]} ({c.path}): its {c.text_column!r} is not a "
        f"string ({type(value).__name__})"
      )
    return value

  return documents_lib.TextDocuments(
    names=lambda i: f"{label}:{chosen[i]}",
    load_text=text,
    tokenizer=tokenizer,
    description=f"hf_datasets/{split}",
    cache_tokens=data_config.cache_tokens,
    num_documents=len(chosen),
  )


def check_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer | None = None
) -> int:
  """Reads every record of the split once: DataError naming the first whose
  text is not a string or has fewer than 2 tokens. Returns their number."""
  docs = get_documents(data_config, split, tokenizer or tokenizers.ByteTokenizer())
  for i in range(len(docs)):
    if len(docs.tokenizer.encode(docs.text(i)[:65])) < 2:
      raise DataError(
        f"{docs.name(i)} ({docs.description}) has fewer than 2 tokens: a "
        "document needs 2 to give one prediction; remove or extend it"
      )
  return len(docs)


def identity(data_config: "DataConfig") -> str:
  """Each split's fingerprint (datasets' digest of its content) and size:
  what a resume compares."""
  loaded = _dataset(data_config.section(Config))
  parts = [
    f"{name or 'records'} {len(d)} records {getattr(d, '_fingerprint', '?')}"
    for name, d in sorted(loaded.items())
  ]
  return "hf_datasets: " + ", ".join(parts)


registry.register(
  registry.Source(
    name="hf_datasets",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    check_documents=check_documents,
    identity=identity,
    location_fields=("path",),
  )
)
