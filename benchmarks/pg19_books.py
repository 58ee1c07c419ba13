"""PG-19-sized books made from the default corpus, and a 32k SentencePiece
model trained on them: a stand-in for PG-19 that needs no download beyond
the project's own `books` corpus (fetched once into ~/.cache/compressive).

    .venv/bin/python benchmarks/pg19_books.py            # build once (cached), print a summary
    .venv/bin/python benchmarks/pg19_books.py --cache_dir=/tmp/bench

What a PG-19 training row costs the host is tokenizing each book it reaches
and slicing its tokens; that depends on how long the books are and on the
text and vocabulary, not on which books they are. So the stand-in keeps what
matters: books of PG-19's size (its train split averages about 400 KB: 69k
words of about 6 bytes), English prose and verse, and a 32k-piece
SentencePiece model trained the way train_tokenizer.py trains PG-19's. Each
book is paragraphs (runs of text between blank lines) of the books corpus's
train split (Shakespeare, Milton, Austen; 13.4 MB, about 70k paragraphs),
drawn in a seeded random order until the book reaches its size; sizes are
drawn uniformly in [0.5, 1.5] x the mean, so books end at different steps
(PG-19's spread is wider; the mean is what sets the cost per step).

Layout, under `<cache_dir>/pg19_books/` (default cache_dir
~/.cache/compressive/bench):

    train/book_000.txt ...      the books: data.source='text_files' reads
                                them as its train split (all of them)
    books.json                  how they were made and their sizes; written
                                last, so a folder without it is rebuilt
    pg19_32k.model              the SentencePiece model (data.spm_model)
    pg19_32k.json               how it was trained; written after it

Both are reused when present and made with the same parameters. The order
of paragraphs comes from NumPy's PCG64 generator, seeded per book: another
NumPy version could draw differently, which only matters when the folder is
rebuilt (the figures measured on it do not depend on which paragraphs).
Not part of the package, not run by CI.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import time
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from compressive import data, files  # noqa: E402
from compressive.data import books as books_lib  # noqa: E402

# The books: PG-19's train split averages ~400 KB a book.
NUM_BOOKS = 120
MEAN_BOOK_BYTES = 400_000
# The tokenizer: the paper's 32k vocabulary, trained on a bounded sample
# (the stand-in holds only 13.4 MB of distinct text; 20 MB of its books
# trained in 25 s on 2 cores).
VOCAB_SIZE = 32_000
SPM_TRAIN_MAX_BYTES = 20_000_000
MODEL_NAME = "pg19_32k"
# Paragraphs are separated by a line that is empty or only blanks.
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def default_cache_dir() -> str:
  return os.path.join(books_lib.default_cache_dir(), "bench")


@dataclasses.dataclass(frozen=True)
class StandIn:
  """Where the built stand-in lies, and what it holds."""

  folder: str  # data.text_files.path
  spm_model: str  # data.spm_model
  num_books: int
  total_bytes: int
  vocab_size: int  # of the trained model (SentencePiece may stop below VOCAB_SIZE)


def _paragraphs(books_cache_dir: str = "") -> list[str]:
  """Paragraphs of the books corpus's train split, in corpus order."""
  config = data.default_data_config()
  config.books.cache_dir = books_cache_dir
  docs = data.get_documents(config, "train", data.ByteTokenizer())
  out = []
  for i in range(len(docs)):
    out.extend(p.strip("\n") for p in _PARAGRAPH_BREAK.split(docs.text(i)) if p.strip())
  return out


def _book(paragraphs: list[str], size: int, rng: np.random.Generator) -> str:
  """Paragraphs in a random order (cycling through fresh permutations) up
  to `size` bytes, blank-line separated, ending with a newline."""
  parts, total = [], 0
  while total < size:
    for k in rng.permutation(len(paragraphs)):
      parts.append(paragraphs[k])
      total += len(paragraphs[k].encode("utf-8")) + 2
      if total >= size:
        break
  return "\n\n".join(parts) + "\n"


def _read_json(path: str) -> Optional[dict]:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _write_json(path: str, value: dict) -> None:
  files.write_text(path, json.dumps(value, indent=1))


def _books_complete(folder: str, manifest: Optional[dict], params: dict) -> bool:
  if not manifest or manifest.get("params") != params:
    return False
  for name, size in manifest["sizes"].items():
    path = os.path.join(folder, "train", name)
    if not os.path.isfile(path) or os.path.getsize(path) != size:
      return False
  return True


def _empty_train_folder(folder: str, manifest_path: str) -> str:
  """`<folder>/train/`, made, without the books of an earlier build and
  without the manifest (incomplete or different until rewritten)."""
  train = os.path.join(folder, "train")
  os.makedirs(train, exist_ok=True)
  if os.path.exists(manifest_path):
    os.remove(manifest_path)
  for name in os.listdir(train):  # books of an earlier, different build
    if name.endswith(".txt"):
      os.remove(os.path.join(train, name))
  return train


def build_books(
  folder: str,
  num_books: int = NUM_BOOKS,
  mean_bytes: int = MEAN_BOOK_BYTES,
  seed: int = 0,
  books_cache_dir: str = "",
) -> dict:
  """Writes `num_books` books into `<folder>/train/` (reused when complete);
  returns the manifest (params, sizes, digest)."""
  params = dict(
    num_books=num_books,
    mean_bytes=mean_bytes,
    seed=seed,
    source="books/train paragraphs",
    size_spread=[0.5, 1.5],
  )
  manifest_path = os.path.join(folder, "books.json")
  manifest = _read_json(manifest_path)
  if _books_complete(folder, manifest, params):
    return manifest
  start = time.perf_counter()
  paragraphs = _paragraphs(books_cache_dir)
  train = _empty_train_folder(folder, manifest_path)
  sizes, digest = {}, hashlib.sha256()
  for i in range(num_books):
    rng = np.random.default_rng([seed, i])
    size = int(mean_bytes * rng.uniform(0.5, 1.5))
    raw = _book(paragraphs, size, rng).encode("utf-8")
    name = f"book_{i:03d}.txt"
    with open(os.path.join(train, name), "wb") as f:
      f.write(raw)
    sizes[name] = len(raw)
    digest.update(hashlib.sha256(raw).digest())
  manifest = dict(
    params=params,
    sizes=sizes,
    total_bytes=sum(sizes.values()),
    sha256_of_sha256s=digest.hexdigest(),
    build_seconds=round(time.perf_counter() - start, 1),
  )
  _write_json(manifest_path, manifest)
  return manifest


def text_files_config(folder: str, spm_model: str = ""):
  """The data config that reads the books as the text_files source, with
  the SentencePiece tokenizer (PG-19's experiment config's data fields)."""
  config = data.default_data_config()
  config.source = "text_files"
  config.text_files.path = folder
  config.tokenizer = "sentencepiece"
  config.spm_model = spm_model
  return config


def build_tokenizer(
  folder: str,
  books_manifest: dict,
  vocab_size: int = VOCAB_SIZE,
  max_bytes: int = SPM_TRAIN_MAX_BYTES,
  seed: int = 0,
) -> tuple[str, int]:
  """Trains the SentencePiece model on the books (train_tokenizer.py's way:
  at most `max_bytes` of the train split in seeded document order), or
  reuses it; returns (model path, its vocabulary size)."""
  model = os.path.join(folder, f"{MODEL_NAME}.model")
  sidecar = os.path.join(folder, f"{MODEL_NAME}.json")
  params = dict(
    vocab_size=vocab_size, max_bytes=max_bytes, seed=seed, books=books_manifest["sha256_of_sha256s"]
  )
  known = _read_json(sidecar)
  if os.path.isfile(model) and known and known.get("params") == params:
    return model, known["vocab_size"]
  start = time.perf_counter()
  config = text_files_config(folder)
  texts = data.iter_texts(config, "train", max_bytes=max_bytes, seed=seed)
  tokenizer = data.train_sentencepiece(
    texts, vocab_size=vocab_size, model_path=model, num_threads=os.cpu_count() or 1, seed=seed
  )
  _write_json(
    sidecar,
    dict(
      params=params,
      vocab_size=tokenizer.vocab_size,
      train_seconds=round(time.perf_counter() - start, 1),
    ),
  )
  return model, tokenizer.vocab_size


def ensure(cache_dir: str = "", books_cache_dir: str = "") -> StandIn:
  """The stand-in under `<cache_dir>/pg19_books/`, built on first use."""
  folder = os.path.join(cache_dir or default_cache_dir(), "pg19_books")
  manifest = build_books(folder, books_cache_dir=books_cache_dir)
  model, vocab = build_tokenizer(folder, manifest)
  return StandIn(
    folder=folder,
    spm_model=model,
    num_books=len(manifest["sizes"]),
    total_bytes=manifest["total_bytes"],
    vocab_size=vocab,
  )


def main(argv) -> None:
  del argv
  from absl import flags

  stand_in = ensure(flags.FLAGS.cache_dir)
  # What one book costs to tokenize: the work a row does when it reaches one.
  tokenizer = data.SentencePieceTokenizer(stand_in.spm_model)
  docs = data.get_documents(
    text_files_config(stand_in.folder, stand_in.spm_model), "train", tokenizer
  )
  seconds, tokens, nbytes = [], [], []
  for i in range(min(3, len(docs))):
    start = time.perf_counter()
    ids = docs.tokens(i)
    seconds.append(time.perf_counter() - start)
    tokens.append(len(ids))
    nbytes.append(docs.num_bytes(i))
  result = dataclasses.asdict(stand_in)
  result.update(
    books_json=_read_json(os.path.join(stand_in.folder, "books.json"))["params"],
    spm_json=_read_json(os.path.join(stand_in.folder, f"{MODEL_NAME}.json")),
    first_books=dict(
      bytes=nbytes,
      tokens=tokens,
      read_and_tokenize_seconds=seconds,
      bytes_per_token=sum(nbytes) / sum(tokens),
    ),
  )
  print(json.dumps(result))


if __name__ == "__main__":
  from absl import app, flags

  flags.DEFINE_string(
    "cache_dir", "", "Folder of the stand-in's pg19_books/ ('' = ~/.cache/compressive/bench)."
  )
  app.run(main)
