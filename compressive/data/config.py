"""The data section of an experiment config: `DataConfig`, every field and its default.

`DataConfig` is the data section typed and frozen, as `config.check`
builds it (`Experiment.data`) and every data function takes it: the fields
every source shares, and one section per registered source, an instance of
that source's schema (registry.Source.schema: a frozen dataclass whose
defaults are the one copy of its fields), read as `data_config.<source>`.
`default_data_config()` is the same defaults as a config file holds them
(`config.data`, a locked ConfigDict: `config.default_config()` gives it to
every config file that starts from the defaults), so that
`--config.data.source=enwik8` style overrides are checked against this list
(a typo is an error, not a new key); e.g.
`--config.data.enwik8.path=/data/enwik8.zip`. The meaning of each field is
the comment beside it, here (the shared ones) and on its source's schema.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Collection, Mapping, TypeVar

import ml_collections
import numpy as np

from compressive import files, values
from compressive.data import registry, tokenizers
from compressive.errors import ConfigError

_log = logging.getLogger("compressive")

S = TypeVar("S")  # a source's schema

TOKENIZERS = ("bytes", "sentencepiece")
SPM_MODEL_TYPES = ("unigram", "bpe", "char", "word")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data section (`config.data`), typed and frozen: built once by
  `config.check` (`Experiment.data`) and what every data function takes.

  The fields every source shares are its own; each source's fields are its
  section, an instance of the source's schema (registry.Source.schema),
  read as `data_config.<source>` (e.g. `data_config.enwik8.path`). A field
  the config leaves out takes its default (the schema's), so a section or
  field added after a config was saved is read at its default.
  """

  source: str = values.text("books")  # which corpus: a registered source, or module:Name
  tokenizer: str = values.text("bytes", TOKENIZERS)
  spm_model: str = values.text("")  # path of a SentencePiece .model (tokenizer=sentencepiece)
  # SentencePiece training (train_tokenizer.py; the paper uses 32k subwords
  # on PG-19): at most spm_train_max_bytes of the train split, sampled in
  # seeded document order. Its seed is a uint32, the coverage a float32.
  spm_vocab_size: int = values.whole(32000, "[1, 2**31)", "an integer >= 1 (pieces), below 2**31")
  spm_model_type: str = values.text("unigram", SPM_MODEL_TYPES, "unigram, bpe, char or word")
  spm_character_coverage: float = values.real(0.9999, "(0, 1]")
  spm_train_max_bytes: int = values.whole(100_000_000, "[1, 2**63)", "an integer >= 1 (bytes)")
  spm_train_seed: int = values.whole(0, "[0, 2**32)")
  # Tokenized documents kept in memory, in tokens; least recently used
  # documents are dropped beyond this.
  cache_tokens: int = values.whole(1 << 26, "[0, 2**63)", "an integer >= 0 (tokens kept in memory)")
  # {source name: its section}: every registered source's (at its schema's
  # defaults where the config has none), and any other the config holds (a
  # plugin's, typed when it is asked for: registry.section).
  sections: dict[str, Any] = dataclasses.field(default_factory=lambda: _registered_sections())

  def __post_init__(self) -> None:
    values.check_fields(self, "data.")

  def section(self, schema: type[S]) -> S:
    """The section whose schema is `schema` (a source's Config), typed as
    it: what `data_config.<name>` gives, for the type checker too
    (registry.section: at its defaults where the config has none)."""
    names = [n for n in registry.names() if registry.get(n).schema is schema]
    if not names and ":" in self.source and registry.get(self.source).schema is schema:
      names = [registry.get(self.source).name]  # a plugin's, named by data.source
    if not names:
      raise ConfigError(f"no data source has the schema {schema.__qualname__}")
    found = registry.section(self, names[0])
    assert isinstance(found, schema), (schema, type(found))
    return found

  def __getattr__(self, name: str) -> Any:
    sections = self.__dict__.get("sections", {})
    if name in sections:
      return sections[name]
    raise AttributeError(f"the data config has no field or section {name!r}")

  @classmethod
  def from_dict(cls, given: Any) -> "DataConfig":
    """From a config's data section (a mapping, or what has to_dict): the
    shared fields, and each registered source's section typed by its
    schema (at its defaults when the config has none); ConfigError naming
    a field or section it does not know, or a value of another kind
    (check_written)."""
    given = given.to_dict() if hasattr(given, "to_dict") else given
    check_written(given)
    sections = _registered_sections()
    for key, section in given.items():
      if key not in SHARED_FIELDS:  # a plugin's is typed when asked for (registry.section)
        sections[key] = (
          values.from_dict(registry.get(key).schema, section, f"data.{key}.")
          if key in sections
          else section
        )
    return cls(**{k: v for k, v in given.items() if k in SHARED_FIELDS}, sections=sections)

  def to_dict(self) -> dict[str, Any]:
    """The section as a config holds it: the shared fields, then each
    source's section."""
    out = {name: getattr(self, name) for name in SHARED_FIELDS}
    for name, section in self.sections.items():  # a plugin's not yet typed: as written
      out[name] = values.to_dict(section) if dataclasses.is_dataclass(section) else dict(section)
    return out


# The fields every source shares (DataConfig's own, but its sections).
SHARED_FIELDS = tuple(f.name for f in dataclasses.fields(DataConfig) if f.name != "sections")


def check_written(given: Any) -> None:
  """ConfigError naming the first field or section of a data section (as
  a config or a saved file holds it) that no version writes: a key that is
  neither a shared field nor a registered source's section (nor, while
  data.source names a plugin, a mapping: its section, whose name is known
  once it is imported), or a value of another kind than its field's. Not
  the ranges: the groups check those as they are made. A section named as
  data.source names a source not registered here is left to the source's
  own check (registry.get names it)."""
  if not isinstance(given, Mapping):
    raise ConfigError(
      f"data must be a section of fields, not {'null' if given is None else type(given).__name__}"
    )
  source = str(given.get("source", ""))
  for key, section in given.items():
    if key in SHARED_FIELDS:
      continue
    if key in registry.names():
      values.check_section(registry.get(key).schema, section, f"data.{key}.")
    elif not ((":" in source or key == source) and isinstance(section, Mapping)):
      raise ConfigError(
        f"data.{key} is not a field of this version's data config (shared: "
        f"{', '.join(sorted(SHARED_FIELDS))}; sections: "
        f"{', '.join(registry.names())})"
      )
  values.check_section(
    DataConfig,
    {k: v for k, v in given.items() if k in SHARED_FIELDS},
    "data.",
    derived=("sections",),
  )


def _registered_sections() -> dict[str, Any]:
  """{name: its schema at its defaults} of every registered source."""
  return {name: registry.get(name).schema() for name in registry.names()}


def default_data_config() -> ml_collections.ConfigDict:
  """The data section as a config file holds it: every field of DataConfig
  and of each registered source's schema at its default, locked (setting a
  field that does not exist, a typo, is an error rather than a new field
  that nothing reads).

  The defaults describe the small default experiment: a byte-level model on
  the public-domain `books` corpus, fetched once into `~/.cache/compressive`.
  """
  c = ml_collections.ConfigDict(DataConfig().to_dict())
  c.lock()
  return c


def _plain(value: Any) -> Any:
  """A section's fields as JSON holds them (tuples and lists alike)."""
  return json.loads(json.dumps(value))


def unread_fields(c: DataConfig) -> list[tuple[str, str]]:
  """(section, field) of every field of a registered source's section other
  than data.source's that differs from its default: fields the run never
  reads (`--config.data.text_files.path=input.txt` while data.source is
  books would train on the books)."""
  selected = registry.get(c.source).name
  found = []
  for name, section in c.sections.items():
    if name == selected or name not in registry.names() or not dataclasses.is_dataclass(section):
      continue
    given = _plain(values.to_dict(section))
    default = _plain(values.to_dict(registry.get(name).schema()))
    found += [(name, k) for k in given if given[k] != default.get(k)]
  return found


def _unread(c: DataConfig, name: str, field: str) -> str:
  value = getattr(c.sections[name], field)
  return (
    f"data.{name}.{field}={value!r} is set, but data.source={c.source!r} reads "
    f"data.{registry.get(c.source).name}, not data.{name}: select that source with "
    f"--config.data.source={name}, or leave data.{name} at its defaults"
  )


def check_unread_sections(c: DataConfig, given: Collection[str] = ()) -> None:
  """What a tool says of the fields the run never reads (unread_fields), by
  where each was set: one the command line sets (`given`, dotted paths of
  its --config.X overrides) is refused, ConfigError naming the source to
  select; one a config file sets is a warning line per section, unless the
  command line chose data.source itself (a config switched to another
  source, its own source's settings left in place)."""
  found = unread_fields(c)
  for name, field in found:
    if f"data.{name}.{field}" in given:
      raise ConfigError(_unread(c, name, field))
  if "data.source" in given:
    return
  seen = set()
  for name, field in found:
    if name not in seen:
      seen.add(name)
      _log.warning("%s", _unread(c, name, field))


def _host_memory() -> int:
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _is_byte_count(value: object) -> bool:
  return bool(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0)


def _check_host_bytes(c: DataConfig, source: registry.Source) -> None:
  """ConfigError when a size of the data config cannot fit this host's
  memory, before anything is generated or read: the source's documents by
  its estimate from its fields (Source.host_bytes), the token cache's
  bound, and the text SentencePiece's training reads."""
  have = _host_memory()
  sizes = [
    (
      f"the documents of data.{source.name} (by their lengths and counts)",
      registry.call_hook(
        c.source, source, "host_bytes", c, returns=(_is_byte_count, "an int >= 0 (bytes)")
      )
      if source.host_bytes
      else 0,
    ),
    (f"data.cache_tokens={c.cache_tokens} int32 tokens", 4 * c.cache_tokens),
    (f"data.spm_train_max_bytes={c.spm_train_max_bytes} bytes of text", c.spm_train_max_bytes),
  ]
  for what, need in sizes:
    if need > have:
      raise ConfigError(
        f"{what} need at least {need / 2**30:,.1f} GiB, {need / have:,.1f} times the "
        f"{have / 2**30:,.1f} GiB of this host's memory: lower the data config's sizes"
      )


def validate_data_config(c: DataConfig, *, need_tokenizer_model: bool = True) -> None:
  """Checks names and paths before anything is read; ConfigError naming the field.

  (The shared fields' ranges DataConfig checks as it is made.) The section
  of data.source by that source's own
  validator (the other sections are not read, so they are not checked),
  then the SentencePiece model, read once to see that it is one.
  need_tokenizer_model=False skips the model (for the step that trains it).
  """
  from compressive.errors import DataError

  source = registry.get(c.source)
  registry.section(c, source.name)
  registry.call_hook(c.source, source, "validate", c)
  _check_host_bytes(c, source)
  if c.tokenizer == "sentencepiece" and need_tokenizer_model:
    if not c.spm_model:
      raise ConfigError(
        "data.spm_model is empty: give the SentencePiece model's path (train one with "
        "train_tokenizer.py)"
      )
    files.check_local(c.spm_model, "data.spm_model (a .model file)")
    what = files.kind(c.spm_model, follow=True)
    if what is None:
      raise ConfigError(
        f"data.spm_model={c.spm_model!r} does not exist: train it with train_tokenizer.py "
        "or fix the path"
      )
    if what != "file":
      raise ConfigError(f"data.spm_model={c.spm_model!r} is {what}, not a .model file")
    try:  # a moment's read: a file that is not a model is named now, not mid-run
      tokenizers.SentencePieceTokenizer(c.spm_model)
    except DataError as e:
      raise ConfigError(str(e)) from None
