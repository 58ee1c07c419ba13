"""enwik8: the first 10^8 bytes of an English Wikipedia XML dump, as bytes.

The standard split is by BYTES, not characters (docs/PAPER.md §Data definitions):
the first 90,000,000 bytes train, the next 5,000,000 validation, the last
5,000,000 test (`data.enwik8.split_bytes`; the sizes must add up to the file
size, which catches a wrong or truncated file). Tokens are the bytes
themselves (vocabulary 256), so bits per token is bits per byte (the paper's
"bpc"); only `data.tokenizer='bytes'` is accepted.

Each split is one stream. For evaluation it stays one document
(`data.enwik8.eval_shards=1`): the paper's single-stream evaluation, read by
one row. For training, rows are pinned to documents, so the stream is cut into
`data.enwik8.train_shards` contiguous documents of (nearly) equal size; with
batch size B this should be at least B (each shard of the default 128 is
~700 KB, far longer than the model's temporal range, so the memory resets at
shard starts cost little). Shards are permuted per epoch like any documents.

`data.enwik8.path` names the file `enwik8` (memory-mapped) or `enwik8.zip`
(the usual distribution; its `enwik8` member is read into memory, 100 MB).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING
import zipfile

import numpy as np

from compressive import files, values
from compressive.data import documents as documents_lib
from compressive.data import registry, tokenizers
from compressive.errors import ConfigError, DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig


@dataclasses.dataclass(frozen=True)
class Config:
  """`data.enwik8`: the file, and how it is cut into splits and documents."""

  path: str = values.text("")  # The enwik8 or enwik8.zip file.
  # Split sizes in bytes (train, validation, test), which must add up to the
  # file size, and how many contiguous documents each split is cut into.
  # Training rows need at least batch_size documents to stay busy;
  # evaluation on one document is the paper's single-stream evaluation.
  split_bytes: tuple = values.sequence((90_000_000, 5_000_000, 5_000_000))
  train_shards: int = values.whole(128, "[1, 2**63)", "an integer >= 1 (documents of a split)")
  eval_shards: int = values.whole(1, "[1, 2**63)", "an integer >= 1 (documents of a split)")

  def __post_init__(self) -> None:
    values.check_fields(self, "data.enwik8.")


def validate(data_config: "DataConfig") -> None:
  c = data_config.section(Config)
  files.check_local(c.path, "data.enwik8.path (a file)")
  if not c.path:
    raise ConfigError("data.enwik8.path is empty: give the enwik8 file or enwik8.zip")
  if not os.path.isfile(c.path):
    raise ConfigError(
      f"data.enwik8.path={c.path!r} does not exist: give the enwik8 file or enwik8.zip"
    )
  sizes = tuple(c.split_bytes)
  if len(sizes) != len(registry.SPLITS):
    raise ConfigError(
      f"data.enwik8.split_bytes={sizes} must be {len(registry.SPLITS)} sizes, "
      f"bytes of {', '.join(registry.SPLITS)}"
    )
  for k, split in enumerate(registry.SPLITS):
    values.integer(
      f"data.enwik8.split_bytes[{k}]",
      sizes[k],
      "[0, 2**63)",
      must=f"an integer >= 0 (bytes of {split})",
    )


def host_bytes(data_config: "DataConfig") -> int:
  """The file's bytes as split_bytes gives them (a zip is read into memory)
  and every split's document bounds (int64 pairs)."""
  c = data_config.section(Config)
  shards = c.train_shards + 2 * c.eval_shards
  return sum(int(s) for s in c.split_bytes) + 16 * shards


def load_bytes(path: str) -> np.ndarray:
  """The whole enwik8 file as uint8 [num_bytes] (memory-mapped if raw)."""
  if not path:
    raise DataError(
      "data.source=enwik8 needs data.enwik8.path, the file enwik8 or "
      "enwik8.zip (http://mattmahoney.net/dc/enwik8.zip)"
    )
  if not os.path.isfile(path):
    raise FileNotFoundError(f"enwik8 file {path!r} (data.enwik8.path) not found")
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as z:
      names = [n for n in z.namelist() if not n.endswith("/")]
      if "enwik8" in names:
        member = "enwik8"
      elif len(names) == 1:
        member = names[0]
      else:
        raise DataError(f"{path}: no member named enwik8 among {names}")
      return np.frombuffer(z.read(member), dtype=np.uint8)
  if os.path.getsize(path) == 0:
    return np.zeros([0], np.uint8)
  return np.memmap(path, dtype=np.uint8, mode="r")


def split_bounds(
  split_bytes: tuple[int, int, int], total: int, split: str, num_shards: int
) -> list[tuple[int, int]]:
  """[start, end) byte ranges of the documents of one split."""
  registry.check_split(split)
  sizes = [int(s) for s in split_bytes]
  if len(sizes) != len(registry.SPLITS) or min(sizes) < 0:
    raise DataError(f"data.enwik8.split_bytes must be {len(registry.SPLITS)} sizes, got {sizes}")
  if sum(sizes) != total:
    raise DataError(
      f"the enwik8 file has {total} bytes but data.enwik8.split_bytes "
      f"{tuple(sizes)} add up to {sum(sizes)}: wrong or truncated file?"
    )
  k = registry.SPLITS.index(split)
  start = sum(sizes[:k])
  if num_shards < 1:
    raise DataError(f"enwik8 shards must be >= 1, got {num_shards}")
  if sizes[k] < 2 * num_shards:
    raise DataError(
      f"enwik8 {split} split of {sizes[k]} bytes cannot be cut into "
      f"{num_shards} documents of at least 2 bytes"
    )
  cuts = start + (np.arange(num_shards + 1, dtype=np.int64) * sizes[k]) // num_shards
  return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.ByteStreamDocuments:
  registry.check_split(split)
  if not isinstance(tokenizer, tokenizers.ByteTokenizer):
    raise DataError("enwik8 is read as bytes: set data.tokenizer='bytes'")
  c = data_config.section(Config)
  buffer = load_bytes(c.path)
  shards = c.train_shards if split == "train" else c.eval_shards
  bounds = split_bounds(tuple(c.split_bytes), len(buffer), split, shards)
  return documents_lib.ByteStreamDocuments(buffer, bounds, description=f"enwik8/{split}")


# Held in memory (or memory-mapped): counting every document's tokens is
# cheap, and finds a shard too short before training does.
registry.register(
  registry.Source(
    name="enwik8",
    schema=Config,
    validate=validate,
    get_documents=get_documents,
    check_documents=registry.checks_every_document(get_documents),
    location_fields=("path",),
    host_bytes=host_bytes,
  )
)
