"""Every hook a registry calls on a plugin, its constructor included, is
held to its contract as `__call__` is: a plugin's own error, or a value it
may not return, is one line naming the plugin and the hook (a ConfigError
or a DataError, exit 2 from a tool), never a traceback, and found before
the work that would need it (a whole evaluation, a tokenizer's training)."""

import os
import sys

import pytest

from compressive import config as config_lib
from compressive import data
from compressive.errors import ConfigError, DataError
from compressive.evaluation import evaluate as eval_lib
from helpers import ROOT, data_of, tiny_experiment
import inprocess

PLUGIN = '''
import dataclasses

import jax.numpy as jnp
import numpy as np

from compressive.data import documents, registry
from compressive.model.compression import MeanPool


class BrokenInit(MeanPool):
  """A compression whose constructor fails (a missing table, say)."""

  def __init__(self, rate, d_model, *, rngs, param_dtype=jnp.float32):
    raise KeyError("weights")


@dataclasses.dataclass(frozen=True)
class Section:
  length: int = 40


@dataclasses.dataclass(frozen=True)
class Picky:
  length: int = 40

  def __post_init__(self):
    raise KeyError("length")


def _texts(data_config, split, tokenizer):
  texts = [" ".join(["word"] * (data_config.plugin_src.length + i)) for i in range(20)]
  return documents.TextDocuments([f"{split}{i}" for i in range(20)], texts.__getitem__,
                                 tokenizer, description=f"plugin_src/{split}")


def _raise(*args):
  raise KeyError("no such shard")


def _bytes(*args):
  yield "some text"
  yield b"bytes, not text"


def _source(**hooks):
  return registry.Source(name="plugin_src", schema=hooks.pop("schema", Section),
                         get_documents=_texts, **hooks)


VALIDATE_RAISES = _source(validate=_raise)
ITER_TEXTS_RAISES = _source(iter_texts=_raise)
ITER_TEXTS_BYTES = _source(iter_texts=_bytes)
SCHEMA_RAISES = _source(schema=Picky)
WORDS_ZERO = _source(official_words=lambda split: 0)
WORDS_NEGATIVE = _source(official_words=lambda split: -5)
WORDS_TEXT = _source(official_words=lambda split: "3007061")
WORDS_RAISES = _source(official_words=_raise)
WORDS_NONE = _source(official_words=lambda split: None)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
  """The module `hooks_mod`, on sys.path (and PYTHONPATH), imported afresh."""
  (tmp_path / "hooks_mod.py").write_text(PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), ROOT]))
  sys.modules.pop("hooks_mod", None)
  yield "hooks_mod"
  sys.modules.pop("hooks_mod", None)


def one_line(result, *expected):
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
    result.returncode,
    result.stderr[-3000:],
  )
  assert "Traceback" not in result.stderr and all(e in lines[0] for e in expected), lines[0]


def config_file(tmp_path, **fields):
  lines = "".join(f"  c.{k} = {v!r}\n" for k, v in fields.items())
  path = tmp_path / "c.py"
  path.write_text(
    f"import sys\nsys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"
    "from helpers import tiny_experiment\n\n\ndef get_config():\n"
    f"  c = tiny_experiment()\n{lines}  return c\n"
  )
  return str(path)


# -- A plugin hook that raises is one line: a compression's constructor, a source's ----
# -- validate, iter_texts, official_words. --------------------------------------------


def test_a_compressions_constructor_that_raises_is_one_line(plugin, tmp_path):
  name = f"{plugin}:BrokenInit"
  with pytest.raises(
    ConfigError,
    match=f"^model.compression='{name}' \\({plugin}.BrokenInit\\): "
    r"its __init__\(2, 32\) raised KeyError: 'weights'",
  ):
    config_lib.check(tiny_experiment(**{"model.compression": name}))
  one_line(
    inprocess.run(
      "train.py",
      [f"--config={config_file(tmp_path)}", "--print_config", f"--config.model.compression={name}"],
    ),
    "its __init__(2, 32) raised KeyError",
  )


def test_a_sources_validate_that_raises_is_one_line(plugin, tmp_path):
  name = f"{plugin}:VALIDATE_RAISES"
  with pytest.raises(
    DataError, match=f"^data.source='{name}': its validate raised KeyError: 'no such shard'$"
  ):
    data.validate_data_config(data_of(tiny_experiment(**{"data.source": name}).data))
  # --print_config reads no data (a path to fill in); the dry run checks it as a start does.
  one_line(
    inprocess.run(
      "train.py",
      [
        f"--config={config_file(tmp_path)}",
        "--dry_run",
        f"--workdir={tmp_path / 'run'}",
        f"--config.data.source={name}",
      ],
    ),
    "its validate raised KeyError",
  )
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
  "name,said",
  [
    ("ITER_TEXTS_RAISES", "its iter_texts raised KeyError: 'no such shard'"),
    ("ITER_TEXTS_BYTES", "its iter_texts gave a bytes; a source's iter_texts gives str texts"),
  ],
)
def test_a_sources_iter_texts_is_held_to_its_contract_by_train_tokenizer(
  plugin, tmp_path, name, said
):
  # The source chosen on the command line: the tiny config's synthetic
  # settings are then left in place without a warning (check_unread_sections).
  config = config_file(tmp_path, **{"data.spm_model": str(tmp_path / "spm.model")})
  one_line(
    inprocess.run(
      "train_tokenizer.py", [f"--config={config}", f"--config.data.source={plugin}:{name}"]
    ),
    said,
  )
  assert not (tmp_path / "spm.model").exists()


@pytest.mark.parametrize(
  "name,said",
  [
    (
      "WORDS_ZERO",
      "its official_words returned int 0; a source's official_words returns None "
      "or an int >= 1 (words)",
    ),
    ("WORDS_NEGATIVE", "its official_words returned int -5"),
    ("WORDS_TEXT", "its official_words returned str '3007061'"),
    ("WORDS_RAISES", "its official_words raised KeyError: 'no such shard'"),
  ],
)
def test_official_words_are_held_to_their_contract_before_the_evaluation(
  plugin, monkeypatch, name, said
):
  # A 0 was a ZeroDivisionError after a whole evaluation; a negative total
  # was accepted.
  experiment = config_lib.check(
    tiny_experiment(**{"data.source": f"{plugin}:{name}"}), training=False
  )

  def no_pass(*args, **kwargs):
    raise AssertionError("the evaluation ran before the hook was checked")

  monkeypatch.setattr(eval_lib, "stream", no_pass)
  with pytest.raises(
    DataError,
    match=f"^data.source='{plugin}:{name}': " + said.replace("(", r"\(").replace(")", r"\)"),
  ):
    eval_lib.evaluate(None, None, experiment, split="validation")


def test_official_words_of_none_count_the_texts_words(plugin):
  experiment = config_lib.check(
    tiny_experiment(**{"data.source": f"{plugin}:WORDS_NONE"}), training=False
  )
  assert (
    data.registry.official_words(
      experiment.data.source, data.registry.get(experiment.data.source), "test"
    )
    is None
  )


# -- Other members: a plugin schema's constructor. -----------------------------------


def test_a_plugin_schema_whose_constructor_raises_is_one_line(plugin, tmp_path):
  name = f"{plugin}:SCHEMA_RAISES"
  with pytest.raises(DataError, match=f"^data.source='{name}': its schema Picky raised KeyError"):
    data.validate_data_config(data_of(tiny_experiment(**{"data.source": name}).data))
  one_line(
    inprocess.run(
      "train.py",
      [f"--config={config_file(tmp_path)}", "--print_config", f"--config.data.source={name}"],
    ),
    f"data.source='{name}': its schema",
    "raised KeyError: 'length'",
  )
