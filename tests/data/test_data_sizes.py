"""Every size of every built-in data source is checked before anything is
generated or read: a huge length or count is one line (ConfigError), in a
moment, never a MemoryError or minutes of silent generation."""

import time

import pytest

from compressive import config as config_lib
from compressive.data import registry
from compressive.errors import ConfigError
from helpers import tiny_experiment

HUGE = 2**40  # a size: more bytes than any host holds, in range of every field
HUGER = 2**64  # beyond every field's range (seeds' included)


def _is_int(value):
  return isinstance(value, int) and not isinstance(value, bool)


def _integer_fields(section):
  """(field, value) for every integer or integer-tuple field of a section,
  read from the section itself, so that a new field is tried too."""
  for name, value in section.items():
    if _is_int(value) or (isinstance(value, tuple) and value and all(map(_is_int, value))):
      yield name, value


def _config_for(source, tmp_path):
  c = tiny_experiment(**{"data.source": source})
  if source == "enwik8":  # validate needs its file to exist
    (tmp_path / "enwik8").write_bytes(b"x" * 100)
    c.data.enwik8.path = str(tmp_path / "enwik8")
  if source == "text_files":
    c.data.text_files.path = str(tmp_path)
  return c


def _cases(tmp_path):
  """(source, field path or None for a shared field, huge value) for every
  integer field of every built-in source's section and the shared fields."""
  builtin = [
    n
    for n in registry.names()
    if registry.get(n).get_documents.__module__.startswith("compressive.data.")
  ]
  shared = tiny_experiment().data
  for name, value in _integer_fields(shared):
    yield "synthetic", name, value
  for source in builtin:
    for name, value in _integer_fields(shared[source]):
      yield source, f"{source}.{name}", value


def test_every_integer_field_of_every_data_source_refuses_a_huge_value_in_a_moment(
  tmp_path, monkeypatch
):
  monkeypatch.setattr(config_lib, "abstract_model", lambda *a: pytest.fail("built"))
  tried = []
  start = time.monotonic()
  for source, field, value in _cases(tmp_path):
    for huge in (HUGE, HUGER):
      if huge == HUGE and field.endswith("seed"):
        continue  # a seed's range holds 2**40; 2**64 is beyond it
      c = _config_for(source, tmp_path)
      target, *path = [c.data] + field.split(".")
      for p in path[:-1]:
        target = target[p]
      target[path[-1]] = tuple([huge] * len(value)) if isinstance(value, tuple) else huge
      with pytest.raises(ConfigError) as e:
        config_lib.check(c)
      assert "\n" not in str(e.value), (field, str(e.value))
      tried.append(field)
  # Every source with integer fields was tried, and the check took moments.
  assert {
    "cache_tokens",
    "spm_vocab_size",
    "spm_train_max_bytes",
    "synthetic.num_docs",
    "synthetic.max_length",
    "synthetic.period",
    "recall.doc_length",
    "recall.facts",
    "recall.num_docs",
    "enwik8.split_bytes",
    "enwik8.train_shards",
  } <= set(tried)
  assert time.monotonic() - start < 20


@pytest.mark.parametrize(
  "field, value, expected",
  [
    ("synthetic.num_docs", (10**9, 4, 4), "the documents of data.synthetic"),
    ("synthetic.max_length", 10**12, "the documents of data.synthetic"),
    ("recall.facts", 10**9, "data.recall.facts=1000000000 facts of 2 events"),
    ("cache_tokens", 2**40, "data.cache_tokens=1099511627776 int32 tokens need at least"),
  ],
)
def test_a_data_size_names_its_field_and_the_hosts_memory(field, value, expected, tmp_path):
  source = field.split(".")[0] if "." in field else "synthetic"
  c = _config_for(source, tmp_path)
  if source == "recall":
    c.data.recall.doc_length = 2048
  target, *path = [c.data] + field.split(".")
  for p in path[:-1]:
    target = target[p]
  target[path[-1]] = value
  with pytest.raises(ConfigError, match=expected):
    config_lib.check(c)
