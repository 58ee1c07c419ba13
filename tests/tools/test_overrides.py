"""--config.X overrides, in process, through the flag parser every tool that
takes them uses (cli.define_config_flag: train.py, aot.py,
train_tokenizer.py): one rule for every type, the last value given wins;
and a data source defined outside the package has its own fields settable
from the command line once the command line names it."""

import os
import sys

from absl import flags
import pytest

from compressive import cli, cli_parse_errors
from helpers import ROOT

DEFAULT = os.path.join(ROOT, "configs", "default.py")


def parse(*overrides, config=DEFAULT):
  """The config that `--config=config *overrides` gives, parsed on flag
  values of its own (as the tools parse theirs)."""
  argv = ["prog", f"--config={config}", *overrides]
  values = flags.FlagValues()
  cli.define_config_flag("config", flag_values=values, sys_argv=argv)
  values(argv)
  return values.config


def failure(*overrides, config=DEFAULT):
  """The one line parse_flags prints for `--config=config *overrides`."""
  argv = ["prog", f"--config={config}", *overrides]
  with pytest.raises(Exception) as e:
    parse(*overrides, config=config)
  line = cli_parse_errors.parse_failure(argv, e.value)
  assert line is not None and "\n" not in line, (line, e.value)
  return line


def field(config, path):
  for name in path.split("."):
    config = config[name]
  return config


# A field of each type, given twice: ml_collections' tuple flags accumulated
# ((32,) then (64,) trained on (32, 64)) while every other type's last value
# won.
@pytest.mark.parametrize(
  "path,first,last,want",
  [
    ("data.recall.distances", "(32,)", "(64,)", (64,)),  # the reported case
    ("data.recall.distances", "32", "64", (64,)),  # one element, unbracketed
    ("mesh.axes", "('a','b','c')", "('x','y')", ("x", "y")),  # a tuple of strings
    ("data.source", "recall", "synthetic", "synthetic"),  # str
    ("model.num_layers", "3", "5", 5),  # int
    ("optimizer.learning_rate", "0.5", "0.25", 0.25),  # float
    ("model.scan_layers", "true", "false", False),  # bool
  ],
)
def test_the_last_value_of_a_repeated_override_wins(path, first, last, want):
  got = field(parse(f"--config.{path}={first}", f"--config.{path}={last}"), path)
  assert got == want and type(got) is type(want)
  # Given once, each is that value; three times, the last.
  assert field(parse(f"--config.{path}={last}"), path) == want
  assert (
    field(
      parse(f"--config.{path}={last}", f"--config.{path}={first}", f"--config.{path}={last}"), path
    )
    == want
  )


def test_every_spelling_of_a_repeated_override_is_last_wins():
  # `--name value` (two arguments), and a boolean's bare and --no forms.
  c = parse("--config.data.recall.distances", "(8,16)", "--config.data.recall.distances=(24,)")
  assert c.data.recall.distances == (24,)
  c = parse("--config.data.recall.distances=(24,)", "--config.data.recall.distances", "(8,16)")
  assert c.data.recall.distances == (8, 16)
  assert (
    parse("--config.model.scan_layers", "--noconfig.model.scan_layers").model.scan_layers is False
  )
  assert (
    parse("--noconfig.model.scan_layers", "--config.model.scan_layers").model.scan_layers is True
  )


@pytest.fixture
def odd_config(tmp_path):
  """A config with a list field and a field that is None."""
  path = tmp_path / "odd.py"
  path.write_text(
    "import ml_collections\n\n"
    "def get_config():\n"
    '  return ml_collections.ConfigDict({"sizes": [1, 2], "extra": None, "n": 1})\n'
  )
  return str(path)


def test_list_and_none_fields_are_last_wins_too(odd_config):
  c = parse("--config.sizes=[3]", "--config.sizes=[4,5]", config=odd_config)
  assert c.sizes == [4, 5] and isinstance(c.sizes, list)
  assert parse("--config.extra=3", "--config.extra=5", config=odd_config).extra == 5
  assert parse("--config.extra=(4,)", config=odd_config).extra == (4,)
  assert parse("--config.extra=abc", "--config.extra=xyz", config=odd_config).extra == "xyz"


def test_a_bad_repeated_value_is_one_line_naming_it():
  line = failure("--config.model.num_layers=3", "--config.model.num_layers=three")
  assert line.startswith("flag --config.model.num_layers=three:"), line


# -- A data source defined outside the package. -----------------------------------


PLUGIN = """
import dataclasses
import numpy as np

from compressive.data import documents, registry


@dataclasses.dataclass(frozen=True)
class OverrideToy:
  n: int = 2
  names: tuple = ("a",)


def _get_documents(data_config, split, tokenizer):
  del tokenizer
  registry.check_split(split)
  return documents.TokenDocuments([np.arange(1, 2 + data_config.override_toy.n, dtype=np.int32)])


TOY = registry.Source(name="override_toy", schema=OverrideToy,
                      get_documents=_get_documents)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
  (tmp_path / "override_plugin.py").write_text(PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  sys.modules.pop("override_plugin", None)
  yield "override_plugin"
  sys.modules.pop("override_plugin", None)


def test_a_plugin_sources_fields_are_set_from_the_command_line(plugin):
  c = parse(
    f"--config.data.source={plugin}:TOY",
    "--config.data.override_toy.n=4",
    "--config.data.override_toy.n=5",
    "--config.data.override_toy.names=('x','y')",
  )
  assert c.data.source == f"{plugin}:TOY"
  assert c.data.override_toy.n == 5 and c.data.override_toy.names == ("x", "y")
  # Named last on the command line wins here too; the section is added at
  # its defaults even with none of its fields given.
  c = parse("--config.data.source=recall", f"--config.data.source={plugin}:TOY")
  assert c.data.override_toy.n == 2


def test_a_plugin_named_only_by_a_config_file_is_not_imported(plugin, tmp_path):
  # A config file's say-so imports nothing while the command line is read
  # (the trainer imports the plugin later, to use it): a field of its section
  # is one line naming the override and the way to have it.
  path = tmp_path / "names_plugin.py"
  path.write_text(
    "from compressive.configs.default import get_config as default\n\n"
    "def get_config():\n  c = default()\n"
    f'  c.data.source = "{plugin}:TOY"\n  return c\n'
  )
  line = failure("--config.data.override_toy.n=4", config=str(path))
  assert line.startswith(
    "cannot apply --config.data.override_toy.n: the config has no field data.override_toy"
  ), line
  assert "--config.data.source=module:Name" in line
  assert plugin not in sys.modules


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it():
  line = failure(
    "--config.data.source=no_such_override_plugin:TOY", "--config.data.override_toy.n=4"
  )
  assert line.startswith(
    "data.source='no_such_override_plugin:TOY': cannot import module 'no_such_override_plugin'"
  ), line


def test_a_mistyped_section_names_the_override():
  line = failure("--config.data.recal.facts=4")
  assert line.startswith(
    "cannot apply --config.data.recal.facts: the config has no field data.recal"
  ), line


@pytest.mark.parametrize(
  "given,want",
  [
    ("(tensorboard,wandb)", ("tensorboard", "wandb")),  # bare words
    ("('tensorboard', 'wandb')", ("tensorboard", "wandb")),  # Python's spelling
    ("(wandb,)", ("wandb",)),
    ("wandb", ("wandb",)),  # one element, its brackets dropped
    ("()", ()),
    ("[tensorboard, my_mod:W]", ("tensorboard", "my_mod:W")),
  ],
)
def test_a_tuple_of_words_is_read_as_its_words(given, want):
  assert parse(f"--config.metric_writers={given}").metric_writers == want
  # Numbers stay numbers, as before.
  assert parse("--config.data.recall.distances=(32,64)").data.recall.distances == (32, 64)
