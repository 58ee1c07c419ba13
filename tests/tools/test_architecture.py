"""The tree shows the architecture (docs/DESIGN.md, "Layers"): each folder of
the package is one layer and imports only the layers below it, there are no
import cycles (imports inside functions and type-checking imports count),
and no function or module outgrows what a reader can hold. The folders
beside the package, experiments/ and benchmarks/, sit above its tools: the
package never imports them, and they are held to the same sizes.

Read from the source with `ast`, so nothing here depends on import order.
"""

import ast
import pathlib

import pytest

import helpers

ROOT = pathlib.Path(helpers.ROOT)
PACKAGE = ROOT / "compressive"
ENTRY_POINTS = (
  "train.py",
  "eval.py",
  "sample.py",
  "analyze.py",
  "export.py",
  "aot.py",
  "train_tokenizer.py",
)

# The command-line tools, each run as `python -m <module>` (the root scripts
# of ENTRY_POINTS run the same modules).
TOOLS = (
  "compressive.train",
  "compressive.eval",
  "compressive.sample",
  "compressive.analyze",
  "compressive.export",
  "compressive.aot.__main__",
  "compressive.train_tokenizer",
)

# Bottom to top. A module may import its own layer and the ones before it.
LAYERS = (
  (
    "base",
    (
      "compressive.errors",
      "compressive.values",
      "compressive.nested",
      "compressive.remote",
      "compressive.reach",
      "compressive.storage",
      "compressive.files",
      "compressive.cli",
      "compressive.cli_config",
      "compressive.cli_flags",
      "compressive.cli_os_errors",
      "compressive.cli_overrides",
      "compressive.cli_parse_errors",
      "compressive.cli_xla",
      "compressive.plugins",
      # the shipped configs (configs/): data, importing only ml_collections
      "compressive.configs",
    ),
  ),
  ("model", ("compressive.model",)),
  ("data", ("compressive.data",)),
  ("scale", ("compressive.scale",)),
  ("config", ("compressive.config", "compressive.experiment")),
  ("evaluation", ("compressive.evaluation",)),  # training evaluates as it goes
  ("training", ("compressive.training",)),
  ("planning", ("compressive.aot",)),
  ("api", ("compressive",)),  # the package's __init__: the public names
  # python -m compressive.train, ...: the command-line tools, and what the
  # tools that read a trained run share (compressive/reading.py)
  ("tools", TOOLS + ("compressive.reading",)),
)
MAX_FUNCTION_LINES = 45
MAX_MODULE_LINES = 450

# Above the package: experiments/ runs the tools as a user does (as
# processes; it imports only the package's command-line helpers, and its own
# modules, by their bare names when run.py runs as a script), and
# benchmarks/ measures the library (any package module, the configs and
# its own common.py). Neither imports the other, nor tests/.
OUTSIDE = {
  # The compressions the recall study tries are plugins: they build on the
  # package's Compression as a user's would.
  "experiments": (
    "compressive.cli",
    "compressive.errors",
    "compressive.files",
    "experiments",
    "children",
    "recall_study",
    "recall_settings",
    "compressive.model.compression",
    "compressive.model.layers",
  ),
  "benchmarks": ("compressive", "configs", "benchmarks"),
}
# Functions of benchmarks/ longer than the limit, exempt by name: each is one
# measurement read top to bottom (set up, warm up, time, report). They may
# not grow past their size when exempted.
EXEMPT_FUNCTIONS = {
  "benchmarks/compare_peer.py main": 108,
  "benchmarks/input_pipeline.py measure_row": 70,
  "benchmarks/throughput.py measure_throughput": 50,
}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _imported(name: str, node: ast.AST) -> list[str]:
  """The package modules an import statement in module `name` names."""
  if isinstance(node, ast.Import):
    targets = [a.name for a in node.names]
  else:
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
      package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
      for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
      base = f"{package}.{base}" if base else package
    targets = [f"{base}.{a.name}" for a in node.names]
    targets = [t if t in MODULES else base for t in targets]
  found = []
  for t in targets:
    while t and t not in MODULES:  # `import a.b.c` of a name inside a module
      t = t.rpartition(".")[0]
    if t and t != name:
      found.append(t)
  return found


def _runtime_imports(tree: ast.AST) -> list[ast.AST]:
  """The import statements of `tree` that run: at any depth (in functions
  too), but not inside `if TYPE_CHECKING:`, whose imports only the type
  checker reads (annotations that name a module's user, which would be a
  cycle if imported)."""
  out = []
  for node in ast.iter_child_nodes(tree):
    if isinstance(node, ast.If) and ast.unparse(node.test) in (
      "TYPE_CHECKING",
      "typing.TYPE_CHECKING",
    ):
      out.extend(_runtime_imports(ast.Module(body=node.orelse, type_ignores=[])))
      continue
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      out.append(node)
    out.extend(_runtime_imports(node))
  return out


def import_graph() -> dict[str, set[str]]:
  graph = {}
  for name, path in MODULES.items():
    tree = ast.parse(path.read_text())
    graph[name] = {t for node in _runtime_imports(tree) for t in _imported(name, node)}
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def layer_of(module: str) -> int:
  best, level = -1, None
  for i, (_, prefixes) in enumerate(LAYERS):
    for prefix in prefixes:
      if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
        best, level = len(prefix), i
  assert level is not None, f"{module} is in no layer of LAYERS"
  return level


def code_lines(node: ast.AST, source_lines: list[str]) -> int:
  """Lines of code in a function: not blank, not comment-only, not its docstring."""
  body = node.body
  doc = set()
  if (
    body
    and isinstance(body[0], ast.Expr)
    and isinstance(body[0].value, ast.Constant)
    and isinstance(body[0].value.value, str)
  ):
    doc = set(range(body[0].lineno, body[0].end_lineno + 1))
  first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
  return sum(
    1
    for n in range(first, node.end_lineno + 1)
    if n not in doc
    and source_lines[n - 1].strip()
    and not source_lines[n - 1].strip().startswith("#")
  )


def _outside_files() -> list[pathlib.Path]:
  return sorted(p for folder in OUTSIDE for p in (ROOT / folder).rglob("*.py"))


def _python_files():
  return sorted(MODULES.values()) + [ROOT / f for f in ENTRY_POINTS] + _outside_files()


def _top_level_imports(path: pathlib.Path) -> set[str]:
  """Every name an import statement of the file imports, in full
  (`from a.b import c` imports a.b.c)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names |= {f"{node.module}.{a.name}" for a in node.names}
  return names


def test_experiments_and_benchmarks_import_only_what_they_may():
  ours = (
    "compressive",
    "configs",
    "benchmarks",
    "experiments",
    "tests",
    "helpers",
    *(p.stem for p in (ROOT / "experiments").glob("*.py")),
  )
  wrong = []
  for path in _outside_files():
    folder = path.relative_to(ROOT).parts[0]
    for name in sorted(_top_level_imports(path)):
      if name.split(".")[0] in ours and not any(
        name == a or name.startswith(a + ".") for a in OUTSIDE[folder]
      ):
        wrong.append(f"{path.relative_to(ROOT)} imports {name}")
  assert wrong == []
  # The package, its tools and the root scripts never reach up to them.
  up = [
    f"{p.relative_to(ROOT)} imports {n}"
    for p in sorted(MODULES.values()) + [ROOT / f for f in ENTRY_POINTS]
    for n in _top_level_imports(p)
    if n.split(".")[0] in OUTSIDE
  ]
  assert up == []
  assert any(p.parts[-2] == "experiments" for p in _outside_files())


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
  # The reader itself, on a statement of each kind it must resolve.
  source = "def f():\n  from compressive.model import memory\n  import compressive.scale.sharding\n"
  tree = ast.parse(source)
  imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
  assert _imported("compressive.config", imports[0]) == ["compressive.model.memory"]
  assert _imported("compressive.config", imports[1]) == ["compressive.scale.sharding"]
  relative = ast.parse("from . import memory\nfrom ..scale import flops\n").body
  assert _imported("compressive.model.transformer", relative[0]) == ["compressive.model.memory"]
  assert _imported("compressive.model.transformer", relative[1]) == ["compressive.scale.flops"]
  assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
  # An import for the type checker only is no edge; one beside it is.
  guarded = ast.parse(
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
    "  from compressive.data import documents\nelse:\n"
    "  from compressive.data import tokenizers\n"
  )
  assert [_imported("compressive.data.registry", n) for n in _runtime_imports(guarded)] == [
    [],
    ["compressive.data.tokenizers"],
  ]  # (typing is no module of the package)


def test_there_are_no_import_cycles():
  assert _cycles(import_graph()) == []


def test_each_layer_imports_only_the_layers_below_it():
  upward = [
    f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
    for m, targets in import_graph().items()
    for t in sorted(targets)
    if layer_of(t) > layer_of(m)
  ]
  assert upward == []


@pytest.mark.parametrize(
  "module,forbidden",
  [
    ("compressive.scale.sharding", "compressive.model"),  # shardings come from the caller's state
    ("compressive.model.compression", "compressive.model.attention"),
    ("compressive.model.config", "compressive.model.compression"),  # registries own their names
    ("compressive.training.runlog", "compressive.evaluation"),  # hms is the base layer's
  ],
)
def test_module_does_not_import(module, forbidden):
  graph = import_graph()
  assert not [t for t in graph[module] if t == forbidden or t.startswith(forbidden + ".")]


def test_no_module_is_longer_than_the_limit():
  long = {
    str(p.relative_to(ROOT)): n
    for p in _python_files()
    if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
  }
  assert long == {}


def test_no_function_is_longer_than_the_limit():
  long = {}
  for path in _python_files():
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = code_lines(node, lines)
        exempt = EXEMPT_FUNCTIONS.get(f"{path.relative_to(ROOT)} {node.name}", MAX_FUNCTION_LINES)
        if n > max(exempt, MAX_FUNCTION_LINES):
          long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
  assert long == {}


def test_every_package_module_is_in_a_layer():
  for module in MODULES:
    layer_of(module)


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_each_root_script_only_runs_its_tool(script):
  # The tool is the package's (it is there after `pip install .`); the
  # script in the checkout runs that module as __main__ and holds nothing else.
  # train.py alone also holds SIGTERM and SIGINT from its first line, before
  # the package (and JAX) is imported (compressive/training/interrupts.py
  # takes them over): a signal in its first second is heard.
  tree = ast.parse((ROOT / script).read_text())
  imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
  held = script == "train.py"
  assert [a.name for n in imports for a in n.names] == ["runpy"] + ["signal"] * held
  calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
  holding = [c for c in calls if ast.unparse(c.func) in ("signal.signal", "_held.signals.append")]
  assert len(holding) == 2 * held
  [call] = [c for c in calls if c not in holding]
  module = call.args[0].value  # a package's tool is its __main__
  ran = module if module in MODULES and module in TOOLS else f"{module}.__main__"
  assert ast.unparse(call.func) == "runpy.run_module" and ran in TOOLS and ran in MODULES
  assert pathlib.Path(script).stem == module.rpartition(".")[2]


# Where ml_collections may be imported: where a config is written,
# overridden and checked, where config.json is written and read, and the data
# sources (a package prefix: each source owns its config section's schema,
# docs/DESIGN.md §Layers of the code). Every other module takes the checked
# Experiment or its typed, frozen parts (compressive/experiment.py).
ML_COLLECTIONS_IMPORTERS = {
  "compressive.cli": "the --config flag (config_flags)",
  "compressive.cli_config": "config files and their overrides",
  "compressive.cli_overrides": "how an override is read (ml_collections' tuple parser)",
  "compressive.config": "the config checked, the Experiment built from it",
  "compressive.training.runconfig": "a saved config.json read back to be checked",
  "compressive.data.config": "the data section as a config file holds it (default_data_config)",
}
# Mentions of `ConfigDict` in compressive/ (code, types and docstrings), which
# the command line and config files parse. A new one past this ceiling is a
# raw config reaching somewhere it should take the Experiment; lower the
# ceiling when mentions go.
MAX_CONFIGDICT_MENTIONS = 20


def _imports_ml_collections(source: str) -> bool:
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import) and any(
      a.name.split(".")[0] == "ml_collections" for a in node.names
    ):
      return True
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ml_collections":
      return True
  return False


def _may_import_ml_collections(module: str) -> bool:
  return any(module == m or module.startswith(m + ".") for m in ML_COLLECTIONS_IMPORTERS)


def _ml_collections_offenders(sources: dict[str, str]) -> list[str]:
  return [
    f"{m} imports ml_collections: take the Experiment or its parts "
    "(compressive/experiment.py), or add it to ML_COLLECTIONS_IMPORTERS with its reason"
    for m, source in sorted(sources.items())
    if _imports_ml_collections(source) and not _may_import_ml_collections(m)
  ]


def test_only_the_config_boundary_imports_ml_collections():
  sources = {name: path.read_text() for name, path in MODULES.items()}
  assert _ml_collections_offenders(sources) == []
  # Each allowed module (or package) still imports it: the list stays exact.
  for allowed in ML_COLLECTIONS_IMPORTERS:
    assert any(
      _imports_ml_collections(s)
      for m, s in sources.items()
      if m == allowed or m.startswith(allowed + ".")
    ), f"{allowed} no longer needs it"
  # The check itself names an offender, whatever form its import takes.
  for statement in (
    "import ml_collections",
    "from ml_collections import config_dict",
    "def f():\n  import ml_collections.config_dict\n",
  ):
    assert _ml_collections_offenders({"compressive.training.step": statement}) == [
      "compressive.training.step imports ml_collections: take the Experiment or its parts "
      "(compressive/experiment.py), or add it to ML_COLLECTIONS_IMPORTERS with its reason"
    ]
  # A data source takes its typed section (its schema), never the ConfigDict.
  assert _ml_collections_offenders({"compressive.data.toy": "import ml_collections"}) != []
  assert _ml_collections_offenders({"compressive.data.config": "import ml_collections"}) == []


def test_configdict_mentions_stay_under_the_ceiling():
  counts = {
    str(p.relative_to(ROOT)): n
    for p in sorted(MODULES.values())
    if (n := p.read_text().count("ConfigDict"))
  }
  total = sum(counts.values())
  outside = {
    p: n for p, n in counts.items() if not _may_import_ml_collections(_module_name(ROOT / p))
  }
  assert total <= MAX_CONFIGDICT_MENTIONS, (
    f"{total} mentions of ConfigDict in compressive/, over the ceiling of "
    f"{MAX_CONFIGDICT_MENTIONS}; outside the config boundary: {outside}"
  )


# Each rename outside compressive/files.py, by (file, function): none of them
# writes a file (files.replacing is the one way a file is replaced whole). A
# new os.replace or os.rename fails here until it is either files.replacing
# or added with what it renames.
RENAMES_THAT_ARE_NOT_WRITES = {
  "compressive/training/lock.py _set_aside": "a non-lock in the lock file's place, aside",
  "compressive/training/exporting.py export": "an export's finished folder into place",
  "compressive/training/checkpoint.py move_aside": "a damaged checkpoint's folder, aside",
  "compressive/training/sidefiles.py set_aside": "a non-file in a side file's place, aside",
  "compressive/training/runconfig.py check_resume_config": "an unreadable config.json, aside",
}


_RENAMING = ("os.replace", "os.rename", "os.renames", "shutil.move")


def _renames(path: pathlib.Path) -> list[str]:
  """'FILE FUNCTION' of each os.replace / os.rename / shutil.move call, in
  the innermost function holding it (<module> outside any)."""
  found = []

  def visit(node, where):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      where = node.name
    if isinstance(node, ast.Call) and ast.unparse(node.func) in _RENAMING:
      found.append(f"{path.relative_to(ROOT)} {where}")
    for child in ast.iter_child_nodes(node):
      visit(child, where)

  visit(ast.parse(path.read_text()), "<module>")
  return found


def test_a_file_is_replaced_only_through_the_one_helper():
  renames = {r for p in _python_files() if p != PACKAGE / "files.py" for r in _renames(p)}
  assert renames == set(RENAMES_THAT_ARE_NOT_WRITES)
  assert _renames(PACKAGE / "files.py") == ["compressive/files.py replacing"]


def test_no_module_re_exports_another_modules_names():
  # Each name is imported from the module that defines it: no facade that
  # re-exports (cli.py, checkpoint.py, config.py once did). An import kept
  # for its side effect alone is the data sources registering themselves.
  kept = [
    f"{path.relative_to(ROOT)}:{i}"
    for path in sorted(MODULES.values())
    for i, line in enumerate(path.read_text().splitlines(), 1)
    if "noqa: F401" in line and path != PACKAGE / "data" / "__init__.py"
  ]
  assert kept == []
