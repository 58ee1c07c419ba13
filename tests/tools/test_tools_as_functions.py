"""Each tool is a function of its arguments: `run(args)` does what the
command does and returns what it printed, its mistakes raised as errors;
the tool's module only parses its flags into those arguments (`Args.
from_flags`), and defines its flags only when it runs as the command
(`define_flags`, called under `__main__`), so importing it for `run`
defines none. The reading tools (eval, export, analyze, sample) are
called here on one trained run, as a library caller would; train.py's
`run` is tests/training/test_train_tool.py's."""

import ast
import importlib
import json
import os
import pathlib

from absl import flags
import pytest

from compressive import analyze, reading
from compressive import eval as eval_tool
from compressive import export as export_tool
from compressive import sample as sample_tool
from compressive.errors import ConfigError
from compressive.training import layout
from compressive.training import loop as train_lib
from helpers import ROOT, tiny_experiment, to_train

TOOLS = {
  "compressive.train": "compressive/train.py",
  "compressive.eval": "compressive/eval.py",
  "compressive.sample": "compressive/sample.py",
  "compressive.analyze": "compressive/analyze.py",
  "compressive.export": "compressive/export.py",
  "compressive.aot.__main__": "compressive/aot/__main__.py",
  "compressive.train_tokenizer": "compressive/train_tokenizer.py",
}
_DEFINES = ("flags.DEFINE_", "flags.mark_flag", "cli_flags.", "cli.define_config_flag")


def _module_level_definitions(source: str) -> list[str]:
  """The flag definitions a module makes as it is imported (outside any
  function and outside its `if __name__ == "__main__":` block)."""
  found = []
  for node in ast.parse(source).body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.If)):
      continue
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
      if ast.unparse(call.func).startswith(_DEFINES):
        found.append(ast.unparse(call))
  return found


@pytest.mark.parametrize("module", sorted(TOOLS))
def test_a_tool_defines_its_flags_only_as_the_command(module):
  tree = ast.parse(pathlib.Path(ROOT, TOOLS[module]).read_text())
  assert _module_level_definitions(ast.unparse(tree)) == []
  names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
  assert {"define_flags", "main", "run"} <= names
  main_block = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n)][-1]
  calls = [ast.unparse(n) for n in main_block.body]
  assert calls[-2:] == ["define_flags()", "cli.run(main, __doc__)"]
  before = set(flags.FLAGS)
  importlib.import_module(module)
  assert set(flags.FLAGS) == before


def test_the_check_finds_a_flag_defined_at_import():
  assert _module_level_definitions('flags.DEFINE_string("x", None, "")\n') != []
  assert _module_level_definitions("cli_flags.define_workdir_flags()\n") != []
  assert _module_level_definitions("def define_flags():\n  cli_flags.define_memory_flags()\n") == []


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("tools") / "wd")
  train_lib.train_and_evaluate(to_train(tiny_experiment(num_train_steps=3)), workdir)
  return workdir


@pytest.mark.slow
def test_the_reading_tools_run_as_functions_of_their_arguments(trained, tmp_path):
  read = reading.Reading(workdir=trained)
  evaluated = eval_tool.run(eval_tool.Args(read, max_segments=2))
  assert evaluated.result["step"] == 3 and evaluated.warning is None
  assert evaluated.saved == layout.Workdir(trained).eval_result("validation", 3)
  assert json.loads(open(evaluated.saved).read()) == evaluated.result
  output = str(tmp_path / "export")
  exported = export_tool.run(export_tool.Args(read, output=output))
  assert exported["step"] == 3 and exported["bytes"] > 0 and os.path.isdir(output)
  # The export reads as the workdir does: the same evaluation.
  again = eval_tool.run(eval_tool.Args(reading.Reading(workdir=output), max_segments=2))
  assert again.result == evaluated.result
  curves = analyze.run(analyze.Args(read, analysis="curves"))
  assert curves.result["figure"] == layout.Workdir(trained).curves
  by_position = analyze.run(analyze.Args(read, analysis="loss_by_position", max_segments=2))
  assert by_position.figure and os.path.isfile(by_position.figure)
  pieces = []
  text = sample_tool.run(
    sample_tool.Args(read, prompt="ab", num_tokens=4, temperature=0.0), pieces.append
  )
  assert text.startswith("ab") and "".join(pieces) == text


@pytest.mark.slow
def test_a_reading_tools_mistake_is_raised_not_exited(trained, tmp_path):
  with pytest.raises(ConfigError, match="--analysis=recall needs a model trained with"):
    analyze.run(analyze.Args(reading.Reading(workdir=trained), analysis="recall"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    eval_tool.run(eval_tool.Args(reading.Reading(workdir=str(tmp_path / "none"))))
