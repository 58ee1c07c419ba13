"""One workdir layout (compressive/training/layout.py): a finished run leaves
only what the layout names, the names are the ones every earlier version
wrote (a workdir or an export of any version is found by them), and no
other module of the package spells them, so a module that joins
"train.log" onto a workdir itself fails here."""

import ast
import os
import pathlib
import re

import pytest

from compressive.training import checkpoint as ckpt_lib
from compressive.training import layout, loop
from helpers import ROOT, tiny_experiment, to_train


@pytest.mark.slow
def test_a_finished_run_leaves_only_what_the_layout_names(tmp_path):
  workdir = tmp_path / "wd"
  config = tiny_experiment(
    **{"num_train_steps": 4, "checkpoint_every_steps": 2, "eval_every_steps": 2}
  )
  loop.train_and_evaluate(to_train(config), str(workdir), profile_steps=(2, 3))
  run = layout.Workdir(str(workdir))

  named = {
    run.config,
    run.lock,
    run.log,
    run.checkpoints,
    run.owner,
    run.profile,
    run.curves,
    run.tensorboard(),
    *run.side_files,
    *run.side_folders,
    *(run.metrics(name) for name in layout.METRICS),
  }
  for path in sorted(named):
    assert os.path.lexists(path), f"{path}: named by the layout, not written by a run"
  assert {os.path.join(workdir, n) for n in os.listdir(workdir)} <= named
  assert {os.path.join(run.tensorboard(), n) for n in os.listdir(run.tensorboard())} == {
    run.tensorboard(name) for name in layout.METRICS
  }
  for name in layout.METRICS:  # tensorboardX's names after the layout's prefix
    prefix = os.path.basename(run.events(name)) + ".out.tfevents."
    assert [n for n in os.listdir(run.tensorboard(name)) if not n.startswith(prefix)] == []
  # Below the owner record, the checkpoints folder is Orbax's: its step folders.
  steps = ckpt_lib.Checkpointer(str(workdir), read_only=True).all_steps()
  assert steps == [2, 4]
  assert sorted(os.listdir(run.checkpoints)) == sorted(
    [layout.OWNER_FILE] + [str(step) for step in steps]
  )


def test_the_names_are_the_ones_on_disk():
  run, export = layout.Workdir("wd"), layout.Export("out")
  assert [
    run.config,
    run.lock,
    run.log,
    run.checkpoints,
    run.owner,
    run.skipped,
    run.tensorboard(),
    run.tensorboard("eval"),
    run.events("train"),
    run.profile,
    run.curves,
    run.wandb,
  ] == [
    "wd/config.json",
    "wd/train.lock",
    "wd/train.log",
    "wd/checkpoints",
    "wd/checkpoints/workdir.json",
    "wd/checkpoints/skipped",
    "wd/tensorboard",
    "wd/tensorboard/eval",
    "wd/tensorboard/train/events",
    "wd/profile",
    "wd/curves.png",
    "wd/wandb",
  ]
  assert [run.metrics(name) for name in layout.METRICS] == [
    "wd/metrics_train.jsonl",
    "wd/metrics_eval.jsonl",
  ]
  assert run.side_files == (
    "wd/config.json",
    "wd/train.log",
    "wd/metrics_train.jsonl",
    "wd/metrics_eval.jsonl",
  )
  assert run.side_folders == ("wd/tensorboard", "wd/tensorboard/train", "wd/tensorboard/eval")
  assert run.eval_result("validation", 4) == "wd/eval_validation_step4.json"
  assert (
    run.analysis_result("loss_by_position", "test", "_memory_length4", "png")
    == "wd/analysis_loss_by_position_test_memory_length4.png"
  )
  assert [export.config, export.manifest, export.params, layout.Export.partial("p", 7)] == [
    "out/config.json",
    "out/export.json",
    "out/params",
    "p/.compressive-export-partial-7",
  ]
  assert [
    layout.set_aside_lock(3),
    layout.aside("wd/train.log"),
    layout.aside("wd/train.log", 2),
    layout.damaged("wd/config.json"),
  ] == [
    "train.lock.set-aside-3",
    "wd/train.log.aside",
    "wd/train.log.aside.2",
    "wd/config.json.damaged",
  ]


# Every name of the layout, whole: a string constant (or a path component of
# one, or of an f-string's text) equal to one is a module spelling it.
NAMES = {
  layout.CONFIG_FILE,
  layout.LOCK_FILE,
  layout.LOG_FILE,
  layout.CHECKPOINT_DIR,
  layout.OWNER_FILE,
  layout.SKIPPED_DIR,
  layout.TENSORBOARD_DIR,
  layout.PROFILE_DIR,
  layout.EXPORT_FILE,
  layout.PARAMS_DIR,
  layout.PARTIAL_EXPORT_PREFIX,
  layout.WANDB_DIR,
  os.path.basename(layout.Workdir("").events("train")),
}
# The names made from values, as their f-string reads with each {value} as {}.
PATTERNS = (
  r"^metrics_.*\.jsonl$",
  r"^metrics_\{\}",
  r"^eval_.*_step.*\.json$",
  r"^eval_\{\}_step",
  r"^analysis_.*\.(json|png)$",
  r"^analysis_\{\}",
  r"\.set-aside-",
  r"\.aside(\.|$)",
  r"\.damaged$",
  "^" + re.escape(layout.PARTIAL_EXPORT_PREFIX),
)
# Strings that hold a name but are no path on disk, each with why.
NOT_PATHS = {
  "params/": "the parameters' prefix of a train state's tree paths (trees.py), not the "
  "export's folder",
}
# The metric writers' names (metric_writers), spelled as names, not folders,
# where they are declared: the config's default and the writers' registry.
WRITER_NAMES = {"tensorboard", "wandb"}
WRITER_NAMES_IN = ("compressive/experiment.py", "compressive/training/writers.py")


def _docstrings(tree: ast.AST) -> set[int]:
  kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
  return {
    id(node.body[0].value)
    for node in ast.walk(tree)
    if isinstance(node, kinds)
    and node.body
    and isinstance(node.body[0], ast.Expr)
    and isinstance(node.body[0].value, ast.Constant)
    and isinstance(node.body[0].value.value, str)
  }


def _texts(tree: ast.AST):
  """(line, text) of each string in the code that is not a docstring: a
  constant as it is, an f-string with each replacement field as {}."""
  docs = _docstrings(tree)
  parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
  for node in ast.walk(tree):
    if isinstance(node, ast.JoinedStr):
      yield (
        node.lineno,
        "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values),
      )
    elif (
      isinstance(node, ast.Constant)
      and isinstance(node.value, str)
      and id(node) not in docs
      and id(node) not in parts
    ):
      yield node.lineno, node.value


def spelled_names(source: str, where: str) -> list[str]:
  """'WHERE:LINE text' for each string of `source` that spells a name of
  the layout (whole, or as a component of a path)."""
  found = []
  for line, text in _texts(ast.parse(source)):
    components = re.split(r"[/\\]", text)
    if text in NOT_PATHS or (text in WRITER_NAMES and where in WRITER_NAMES_IN):
      continue
    if any(c in NAMES for c in components) or any(
      re.search(p, c) for p in PATTERNS for c in components
    ):
      found.append(f"{where}:{line} {text!r}")
  return found


def _sources():
  root = pathlib.Path(ROOT)
  paths = sorted((root / "compressive").rglob("*.py"))
  paths += sorted(root.glob("*.py"))  # the root scripts, which only run the tools
  return {
    str(p.relative_to(root)): p.read_text()
    for p in paths
    if p != root / "compressive" / "training" / "layout.py"
  }


def test_no_module_but_the_layout_spells_a_name():
  found = [hit for where, source in _sources().items() for hit in spelled_names(source, where)]
  assert found == [], (
    "take these paths from compressive/training/layout.py (Workdir, "
    "Export), or list a string that is no path in NOT_PATHS with why"
  )


@pytest.mark.parametrize(
  "statement",
  [
    'path = os.path.join(workdir, "train.log")',
    'LOCK = "train.lock"',
    'logdir = os.path.join(workdir, "tensorboard", name)',
    'jsonl = os.path.join(workdir, f"metrics_{name}.jsonl")',
    'jsonl = "metrics_eval.jsonl"',
    'print(f"tensorboard --logdir {workdir}/tensorboard")',
    'result = f"{workdir}/eval_{split}_step{step}.json"',
    'stem = f"analysis_{name}_{split}{suffix}.{extension}"',
    'stem = os.path.join(workdir, f"analysis_{FLAGS.analysis}_{FLAGS.split}{suffix}")',
    'name = f"{LOCK_FILE}.set-aside-{n}"',
    'aside = path + ".damaged"',
    'manifest = os.path.join(path, "export.json")',
    'record = os.path.join(workdir, CHECKPOINT_DIR, "workdir.json")',
  ],
)
def test_the_check_names_a_module_that_spells_one(statement):
  [found] = spelled_names(f"import os\n\n{statement}\n", "m.py")
  assert found.startswith("m.py:3 ")


def test_the_check_leaves_prose_and_docstrings_alone():
  source = (
    '"""Writes config.json and train.log."""\n'
    'def f():\n  """Reads metrics_train.jsonl."""\n'
    '  raise ValueError("restore the run\'s config.json from a copy")\n'
    'KEY = "eval_every_steps"\n'
  )
  assert spelled_names(source, "m.py") == []


# -- A run's place is a value. ------------------------------------------------------


def _process_state_offenders(sources: dict[str, str]) -> list[str]:
  """Each module that overwrites a flag's value (`FLAGS[name].value = ...`,
  `FLAGS.name = ...`) or filters the package's log lines: how a gs://
  workdir was once worked in (the flags pointed at a local copy, a filter
  rewrote every line's text)."""
  found = []
  for name, source in sources.items():
    for node in ast.walk(ast.parse(source)):
      targets = node.targets if isinstance(node, ast.Assign) else []
      for target in targets:
        text = ast.unparse(target)
        if re.match(r"(flags\.)?FLAGS(\[|\.)", text):
          found.append(f"{name} sets {text}")
      if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".addFilter"):
        receiver = ast.unparse(node.func)[: -len(".addFilter")]
        if receiver not in ("absl_log",):  # Orbax's read-only notice, on absl's logger
          found.append(f"{name} filters {receiver}")
  return found


def test_no_module_points_the_flags_or_the_log_at_a_local_copy():
  sources = {
    str(p.relative_to(ROOT)): p.read_text()
    for p in sorted(pathlib.Path(ROOT, "compressive").rglob("*.py"))
  }
  assert _process_state_offenders(sources) == []


@pytest.mark.parametrize(
  "statement",
  [
    "flags.FLAGS['workdir'].value = local",
    "FLAGS.output = local",
    "_LOG.addFilter(_PUBLIC)",
  ],
)
def test_the_check_names_a_module_that_holds_the_place_in_the_process(statement):
  assert _process_state_offenders({"m.py": statement}) != []


def test_a_workdir_on_this_machine_names_its_own_paths(tmp_path):
  run = layout.workdir(str(tmp_path))
  assert (run.url, run.mirror, run.deadline) == (None, None, None)
  assert run.checkpoints == str(tmp_path / "checkpoints") and run.name == str(tmp_path)
  assert run.public(f"cannot write {run.config}") == f"cannot write {run.config}"
  assert layout.workdir(run) is run and layout.workdir(tmp_path) == run  # a path-like too
  assert layout.export(run).params == str(tmp_path / "params")
  run.push()  # nothing to copy: a folder on this machine
  with layout.opened(str(tmp_path)) as opened:
    assert opened == run
