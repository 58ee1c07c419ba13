"""The data sources by name, and the one SPLITS they are all cut into.

A data source is one module that registers itself once, at import:

    registry.register(registry.Source(
        name='enwik8', schema=Config, validate=validate,
        get_documents=get_documents, check_documents=...))

and is imported by `compressive/data/__init__.py`, so that it is registered
whenever `compressive.data` is. A Source defined outside this package is
named `module:Name` in data.source and imported on demand (`get`). Its name
is a value of `config.data.source`, and its fields live in their own
section, `config.data.<name>` (its `schema`: a frozen dataclass whose
defaults are the one copy of its fields, so `--config.data.enwik8.path=...`
overrides it), apart from the fields every source shares (source, tokenizer,
spm_*, cache_tokens). The data config's defaults and validation,
`get_documents`, `check_documents` and `iter_texts` (sources.py) and the
tests all read this registry instead of keeping their own list of names:
adding a source touches no other file.

Nothing here imports a source: the registry is filled by the sources.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from compressive import plugins, values
from compressive.errors import ConfigError, DataError, UserError

# Annotations name `Documents` (data/documents.py, which imports this module)
# and `Tokenizer` (data/tokenizers.py), imported for the type checker only:
# no import when the code runs, no cycle.
if TYPE_CHECKING:
  from compressive.data.config import DataConfig
  from compressive.data.documents import Documents
  from compressive.data.tokenizers import Tokenizer

# Every source is cut into these, in this order (a source whose splits are
# sized by a triple, e.g. data.synthetic.num_docs, reads it in this order).
SPLITS = ("train", "validation", "test")


def check_split(split: str) -> None:
  """DataError unless `split` is one of SPLITS."""
  if split not in SPLITS:
    raise DataError(f"split must be one of {SPLITS}, got {split!r}")


def _no_checks(data_config: "DataConfig") -> None:
  del data_config


@dataclasses.dataclass(frozen=True)
class Source:
  """What a data source provides.

  Every function takes the whole data config (a DataConfig,
  `Experiment.data`): a source reads its own section `data_config.<name>`
  (an instance of its schema) and, where it needs them, the shared fields
  (tokenizer, cache_tokens).

  Attributes:
    name: the value of data.source, and the name of the section.
    schema: the section's frozen dataclass: each field with its type and
      default (the one copy of the source's fields; the default config's
      section is its defaults, data.default_data_config); a field the
      config does not know is an error naming it.
    get_documents: (data_config, split, tokenizer) -> Documents of the split.
    validate: (data_config) -> None; checks the section before anything is
      read and raises ConfigError naming the field as `data.<name>.<field>`
      (one line). Called only when this source is data.source.
    check_documents: (data_config, split, tokenizer) -> ignored; finds up
      front what reading the split would otherwise find mid-run (DataError
      naming the document). None: nothing beyond what get_documents checks.
    iter_texts: (data_config, split, max_bytes, seed) -> the original texts
      of the split, e.g. to train a tokenizer on. None: those of
      get_documents' TextDocuments in a seeded order (sources.iter_texts).
    identity: (data_config) -> a short string that changes when the corpus
      does under the same config (text_files: its files' names and sizes),
      recorded with every checkpoint and compared on resume. None: the
      source's data cannot change under the same config (pinned archives,
      generated data). A plugin source reading files that may change gives
      this hook.
    location_fields: the fields of the section that only say where the data
      is (a path, a cache folder): every other field of the section is a
      generating field, recorded with every checkpoint and export and
      compared by every resume and reader (`sources.data_identity`), so
      another data.synthetic.seed is another run's data, while a corpus
      moved to another folder is the same.
    host_bytes: (data_config) -> the bytes the source's documents of every
      split take in host memory at the least, from its fields alone (its
      lengths and counts), computed before anything is generated or read
      and compared with this host's memory by validate_data_config, so a
      huge length or count is one line, not a MemoryError or a silent
      generation. None: nothing is held that its fields size (files whose
      size the files decide).
    location: (data_config) -> where the source reads its data, in words
      (a path or a URL), for the run's start and --dry_run. None: the
      values of its location_fields, or "generated" when it has none.
    official_words: (split) -> the split's published word total, by which
      its word-level perplexity is normalised, or None (then the words
      counted in its texts are). A source that has this hook gets
      `word_perplexity` after a complete evaluation pass (pg19). None: no
      word-level perplexity.
  """

  name: str
  schema: type
  get_documents: Callable[["DataConfig", str, "Tokenizer"], "Documents"]
  validate: Callable[["DataConfig"], None] = _no_checks
  check_documents: Optional[Callable[["DataConfig", str, "Tokenizer"], object]] = None
  iter_texts: Optional[Callable[["DataConfig", str, Optional[int], int], Iterator[str]]] = None
  identity: Optional[Callable[["DataConfig"], str]] = None
  location_fields: tuple[str, ...] = ()
  location: Optional[Callable[["DataConfig"], str]] = None
  official_words: Optional[Callable[[str], Optional[int]]] = None
  host_bytes: Optional[Callable[["DataConfig"], int]] = None


_SOURCES: dict[str, Source] = {}


def may_write() -> bool:
  """Whether a source may download or prepare its data now: not while a
  saved run is read (plugins.saved_config: compressive.load and the tools
  that read a run), whose config never chooses where anything is written."""
  return not plugins.reading_saved_config()


def register(source: Source) -> Source:
  """Adds a source; a second source of the same name is an error (two
  modules claiming one config section would silently shadow each other)."""
  if not source.name.isidentifier():
    raise ValueError(
      f"data source name {source.name!r} must be a Python identifier "
      "(it names the config section data.<name>)"
    )
  if source.name in _SOURCES:
    raise ValueError(f"data source {source.name!r} is already registered")
  if not dataclasses.is_dataclass(source.schema):
    raise ValueError(
      f"data source {source.name!r}: its schema must be a dataclass (its fields and their defaults)"
    )
  _SOURCES[source.name] = source
  return source


# The longest corpus identity a source may give (it is recorded with every
# checkpoint and export): a digest and a few words.
IDENTITY_CHARS = 4096


def is_plugin(source: Source) -> bool:
  """Whether a source was defined outside this package (a plugin): its
  get_documents was."""
  return not str(getattr(source.get_documents, "__module__", "") or "").startswith("compressive.")


def call_hook(
  name: str,
  source: Source,
  hook: str,
  *args: Any,
  returns: Optional[tuple[Callable[[Any], bool], str]] = None,
) -> Any:
  """A source's hook (data.source=`name`), held to its contract: a plugin's
  own error, anything but a UserError or OSError, which are already
  reported in one line, is a DataError naming the source and the hook; a
  built-in one's is a bug and keeps its traceback. `returns` (a predicate
  and what it asks for, in words): a value it refuses is a DataError too."""
  try:
    value = getattr(source, hook)(*args)
  except (UserError, OSError):
    raise
  except Exception as e:
    if not is_plugin(source):
      raise
    raise DataError(
      f"data.source={name!r}: its {hook} raised "
      f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    ) from e
  if returns is not None and not returns[0](value):
    shown = " ".join(repr(value).split())
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise DataError(
      f"data.source={name!r}: its {hook} returned {type(value).__name__} "
      f"{shown}; a source's {hook} returns {returns[1]}"
    )
  return value


def checked_texts(name: str, source: Source, texts: Any) -> Iterator[str]:
  """The texts a source's iter_texts gives, each held to the contract as
  it comes (a str; the hook's own error, raised by the iteration, as
  call_hook reports it): a plugin's broken hook is one line naming it."""
  iterator = call_hook(name, source, "iter_texts", *texts) if isinstance(texts, tuple) else texts
  while True:
    try:
      text = next(iterator)
    except StopIteration:
      return
    except (UserError, OSError):
      raise
    except Exception as e:
      if not is_plugin(source):
        raise
      raise DataError(
        f"data.source={name!r}: its iter_texts raised "
        f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
      ) from e
    if not isinstance(text, str):
      raise DataError(
        f"data.source={name!r}: its iter_texts gave a {type(text).__name__}; a "
        "source's iter_texts gives str texts"
      )
    yield text


def official_words(name: str, source: Source, split: str) -> Optional[int]:
  """The split's published word total by the source's official_words hook
  (None: none, or no hook), held to its contract: None or an int >= 1."""
  if source.official_words is None:
    return None
  return call_hook(
    name,
    source,
    "official_words",
    split,
    returns=(
      lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
      "None or an int >= 1 (words)",
    ),
  )


def schema_section(name: str, source: Source, section: Any, prefix: str) -> Any:
  """The source's section typed by its schema (values.from_dict), a plugin
  schema's own error (its __post_init__) one line naming the source."""
  try:
    return values.from_dict(source.schema, section, prefix)
  except (UserError, OSError):
    raise
  except Exception as e:
    if not is_plugin(source):
      raise
    raise DataError(
      f"data.source={name!r}: its schema {source.schema.__name__} raised "
      f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    ) from e


def unregister(name: str) -> None:
  """Removes a source (tests that register a toy one clean up with this)."""
  _SOURCES.pop(name, None)


def names() -> tuple[str, ...]:
  """The registered sources' names, in the order they registered."""
  return tuple(_SOURCES)


def get(name: str) -> Source:
  """The source named by data.source: a registered name, or `module:Name`
  for a Source defined outside this package, whose module is imported now
  (so a config that names it, config.json included, imports it again
  wherever it is read). ConfigError (one line) naming the choices, or why
  the outside one cannot be had."""
  return plugins.lookup(
    "data.source",
    name,
    _SOURCES,
    lambda s: isinstance(s, Source),
    "a compressive.data.registry.Source",
  )


def section(data_config: "DataConfig", name: str) -> Any:
  """data_config.<name>, the source's own fields (an instance of its
  schema; at its defaults where the config has none); ConfigError when no
  source of that name is registered or named by data.source.

  A source named `module:Name` is not registered when the config is read:
  its section is typed here, the first time it is asked for."""
  sections = data_config.sections
  source = _SOURCES.get(name)
  if source is None and ":" in data_config.source:
    plugin = get(data_config.source)
    source = plugin if plugin.name == name else None
  if source is None:
    raise ConfigError(
      f"the data config has no section data.{name}: no data source of that name is registered"
    )
  if name not in sections:  # a source registered after the config was read: its defaults
    sections[name] = schema_section(data_config.source, source, {}, f"data.{name}.")
  if not dataclasses.is_dataclass(sections[name]):  # a plugin's, as the config wrote it
    sections[name] = schema_section(data_config.source, source, sections[name], f"data.{name}.")
  stray = sorted(k for k, v in sections.items() if not dataclasses.is_dataclass(v))
  if stray:  # a section no source reads (a typo of the plugin's, or another plugin's)
    raise ConfigError(
      f"data.{stray[0]} is not a section of this data config: "
      f"data.source={data_config.source!r} reads data.{name}"
    )
  return sections[name]


def checks_every_document(
  get_documents: Callable[..., "Documents"],
) -> Callable[["DataConfig", str, "Tokenizer"], None]:
  """A check_documents for sources built in memory: builds the split and
  counts every document's tokens, a moment's work that turns a document of
  fewer than 2 tokens into a DataError naming it before training starts."""

  def check(data_config: "DataConfig", split: str, tokenizer: "Tokenizer") -> None:
    docs = get_documents(data_config, split, tokenizer)
    for i in range(len(docs)):
      docs.num_tokens(i)

  return check
