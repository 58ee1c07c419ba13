"""get_documents / check_documents / iter_texts: one split of data.source.

Each dispatches through the registry (registry.py) to the source named by
`data_config.source`; the sources themselves are the modules that register
(books, enwik8, pg19, text_files, synthetic, recall, ...).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Iterator

from compressive.data import documents as documents_lib
from compressive.data import iterator as iterator_lib
from compressive.data import registry, tokenizers
from compressive.errors import DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig


def _source(data_config: "DataConfig", split: str) -> registry.Source:
  """The registered source of data.source, once split and section are known good."""
  registry.check_split(split)
  source = registry.get(data_config.source)
  registry.section(data_config, source.name)
  return source


def get_documents(
  data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer
) -> documents_lib.Documents:
  """The documents of `split` (one of registry.SPLITS) of data.source; a
  split without any is a DataError naming it, found when the split is opened
  (training opens its evaluation split at start-up), not when a pass over
  it would divide by nothing. What a source returns is held to the
  contract: a Documents (else a DataError naming the source)."""
  source = _source(data_config, split)
  docs = registry.call_hook(
    data_config.source, source, "get_documents", data_config, split, tokenizer
  )
  if not isinstance(docs, documents_lib.Documents):
    raise DataError(
      f"data.source={data_config.source!r}: its get_documents returned a "
      f"{type(docs).__name__}; a source returns a compressive.data.Documents "
      "(TokenDocuments, TextDocuments, ...)"
    )
  if not len(docs):
    raise DataError(
      f"the {split} split of data.source={data_config.source} ({docs.description}) has no documents"
    )
  return docs


def check_documents(data_config: "DataConfig", split: str, tokenizer: tokenizers.Tokenizer) -> None:
  """Finds up front what reading `split` would otherwise find mid-run.

  Raises DataError naming the first bad document, as get_documents and
  Documents.tokens would when a batch row reached it. What is checked is
  the source's choice (registry.Source.check_documents); today:
  - text_files: every file is read once (streamed, one at a time): it must
    be readable, not empty, UTF-8 (unless data.text_files.text_errors=
    'replace'), have at least 2 tokens, and a printable UTF-8 name;
  - synthetic, recall, enwik8 (held in memory): every document has at least
    2 tokens;
  - books (pinned archives), pg19 (prepared by TFDS): nothing more than
    get_documents does.
  Costs one read of the split for text_files; a moment for the others.
  """
  source = _source(data_config, split)
  if registry.is_plugin(source):  # what its get_documents returns, held to the contract
    get_documents(data_config, split, tokenizer)
  if source.check_documents is not None:
    registry.call_hook(data_config.source, source, "check_documents", data_config, split, tokenizer)


def iter_texts(
  data_config: "DataConfig", split: str, max_bytes: int | None = None, seed: int = 0
) -> Iterator[str]:
  """Yields original texts of a split (e.g. to train a tokenizer).

  Unless the source gives its own (registry.Source.iter_texts), documents
  come in a seeded random order, so that a `max_bytes` budget samples the
  whole split rather than its first books; the document that crosses the
  budget is the last one yielded.
  """
  source = _source(data_config, split)
  if source.iter_texts is not None:  # held to its contract, text by text
    yield from registry.checked_texts(
      data_config.source, source, (data_config, split, max_bytes, seed)
    )
    return
  docs = get_documents(data_config, split, tokenizers.ByteTokenizer())
  if not isinstance(docs, documents_lib.TextDocuments):
    raise DataError(
      f"data.source={data_config.source} has no text to train a tokenizer "
      "on (it is read as bytes or tokens)"
    )
  total = 0
  for i in iterator_lib.epoch_permutation(seed, 0, len(docs)):
    text = docs.text(int(i))
    yield text
    total += len(text.encode("utf-8"))
    if max_bytes is not None and total >= max_bytes:
      return


def corpus_identity(data_config: "DataConfig") -> str | None:
  """The source's digest of its corpus (registry.Source.identity), or None
  when the source's data cannot change under the same config."""
  source = registry.get(data_config.source)
  registry.section(data_config, source.name)
  if source.identity is None:
    return None
  return registry.call_hook(
    data_config.source,
    source,
    "identity",
    data_config,
    returns=(
      lambda v: isinstance(v, str) and 0 < len(v) <= registry.IDENTITY_CHARS,
      f"a str of 1 to {registry.IDENTITY_CHARS} characters",
    ),
  )


def data_identity(data_config: "DataConfig") -> dict:
  """What the data config says the corpus is: {"source": data.source,
  <section>: its generating fields} (the section without the source's
  location_fields, registry.Source). Recorded with every checkpoint and
  export and compared by every resume and reader, for every source, plugin
  sources included: a changed data.synthetic or data.recall section is
  other documents."""
  source = registry.get(data_config.source)
  section = registry.section(data_config, source.name)
  fields = json.loads(json.dumps(dataclasses.asdict(section)))  # tuples as JSON lists
  for name in source.location_fields:
    fields.pop(name, None)
  return {"source": data_config.source, source.name: fields}


def describe(data_config: "DataConfig", counts: dict[str, int] | None = None) -> str:
  """The corpus in words, for the run's start and --dry_run: data.source,
  where it reads (Source.location), and `counts`' documents per split:
  `data.source=text_files (input.txt): train 59, validation 3, test 3
  documents`."""
  source = registry.get(data_config.source)
  section = registry.section(data_config, source.name)
  if source.location is not None:
    where = str(registry.call_hook(data_config.source, source, "location", data_config))
  else:
    where = ", ".join(
      str(getattr(section, f)) for f in source.location_fields if getattr(section, f, "")
    ) or ("generated" if not source.location_fields else "not set")
  text = f"data.source={data_config.source} ({where})"
  if counts:
    text += ": " + ", ".join(f"{split} {n:,}" for split, n in counts.items()) + " documents"
  return text
