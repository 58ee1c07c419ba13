"""The installable package: configs found by name from any directory, JAX's
persistent compilation cache (on by default, and a warm run compiles
nothing), and the Python snippet of docs/EVALUATION.md ("From Python") run
from an installed wheel in another directory."""

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib

import jax
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
import pytest

from compressive import cli, cli_config
from compressive.training import loop as train_lib
from helpers import ROOT, TESTS, tiny_experiment, to_train
import processes

TIMEOUT = 600


def python(*args, cwd, env=None):
  return processes.run(
    [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
  )


# -- Configs by name. -----------------------------------------------------------


def test_a_bare_name_is_a_shipped_config(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert {"default", "enwik8", "gpu8"} <= set(cli_config.config_names())
  assert cli_config.resolve_config("default") == os.path.join(cli_config.CONFIG_DIR, "default.py")
  assert (
    cli_config.resolve_config("gpu8:pg19")
    == os.path.join(cli_config.CONFIG_DIR, "gpu8.py") + ":pg19"
  )
  # configs/paper.py is what the paper's configs share, with no get_config:
  # not a name a user can train.
  assert "paper" not in cli_config.config_names()
  for value in (
    "configs/default.py",
    "default.py",
    "nope",
    "/x/default",
    "",
    "gpu8.py:pg19",
    "paper",
  ):
    assert cli_config.resolve_config(value) == value
  (tmp_path / "default").write_text("")  # a file of that name here is the file
  assert cli_config.resolve_config("default") == "default"


@pytest.mark.slow
@pytest.mark.parametrize(
  "args,message",
  [
    (["--config=enwik8", "--config.model.num_layerz=2"], "cannot apply --config.model.num_layerz"),
    (["--config", "gpu1:recall", "--config.batch_sizee=2"], "cannot apply --config.batch_sizee"),
    (["--config=enwik9"], "--config=enwik9: no such config name (default, "),
  ],
  ids=["name", "name with argument", "unknown name"],
)
def test_train_finds_a_config_by_name_from_another_directory(tmp_path, args, message):
  # The config is loaded (the override of a field it lacks is the error), from
  # a directory without configs/.
  r = python(os.path.join(ROOT, "train.py"), f"--workdir={tmp_path}/wd", *args, cwd=tmp_path)
  assert r.returncode == 2, r.stderr[-3000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], r.stderr[-3000:]
  assert not os.path.exists(tmp_path / "wd")


def _shadow(folder, kind):
  """A `configs` of the user's in folder that no shipped config may import:
  a package (its own configs/default.py, as in many ML projects) or a module
  configs.py."""
  if kind == "package":
    os.makedirs(folder / "configs")
    (folder / "configs" / "__init__.py").write_text("")
    (folder / "configs" / "default.py").write_text(
      "raise ImportError('the folder configs/default.py was imported')\n"
    )
  else:
    (folder / "configs.py").write_text("raise ImportError('the folder configs.py was imported')\n")


def _load_file(path):
  spec = importlib.util.spec_from_file_location(f"_shipped_{os.path.basename(path)[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("kind", ["package", "module"])
def test_no_folder_shadows_the_shipped_configs(tmp_path, monkeypatch, kind):
  # `python -m` puts the current folder first on sys.path; so does a
  # project's own layout. Every shipped config (and a preset's experiment)
  # loads as --config loads it, by its file, with the shipped bases.
  _shadow(tmp_path, kind)
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  for name in [
    m
    for m in sys.modules
    if m in ("configs", "compressive.configs") or m.startswith("compressive.configs.")
  ]:
    monkeypatch.delitem(sys.modules, name)
  for name in cli_config.config_names():
    module = _load_file(cli_config.resolve_config(name))
    config = (
      module.get_config("recall") if name in ("gpu1", "gpu8", "tpu_v5e8") else module.get_config()
    )
    assert config.model.d_model > 0
  assert "configs" not in sys.modules
  assert sys.modules["compressive.configs.default"].__file__ == os.path.join(
    cli_config.CONFIG_DIR, "default.py"
  )


@pytest.mark.slow
def test_python_m_from_a_folder_with_its_own_configs(tmp_path):
  # The tool as a user runs it: its config (which builds on default) loads,
  # and the mistyped override is the one line.
  _shadow(tmp_path, "package")
  r = python(
    "-m",
    "compressive.train",
    f"--workdir={tmp_path}/wd",
    "--config=gpu1:default_rope",
    "--config.batch_sizee=2",
    cwd=tmp_path,
  )
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
  assert "cannot apply --config.batch_sizee" in lines[0], r.stderr[-3000:]
  assert not os.path.exists(tmp_path / "wd")


# -- The persistent compilation cache. --------------------------------------------


@pytest.mark.parametrize(
  "flag,environ,expected",
  [
    (None, {}, cli.default_compilation_cache()),
    (None, {"COMPRESSIVE_COMPILATION_CACHE": "/c"}, "/c"),
    (None, {"COMPRESSIVE_COMPILATION_CACHE": ""}, ""),
    (None, {"JAX_COMPILATION_CACHE_DIR": "/j"}, None),  # JAX's own setting is kept
    (None, {"JAX_COMPILATION_CACHE_DIR": "/j", "COMPRESSIVE_COMPILATION_CACHE": "/c"}, None),
    ("/f", {"JAX_COMPILATION_CACHE_DIR": "/j", "COMPRESSIVE_COMPILATION_CACHE": "/c"}, "/f"),
    ("", {"COMPRESSIVE_COMPILATION_CACHE": "/c"}, ""),
  ],
)
def test_where_the_compilation_cache_goes(flag, environ, expected):
  assert cli.compilation_cache_dir(flag, environ) == expected


def test_default_compilation_cache_is_under_the_users_cache():
  assert cli.default_compilation_cache() == os.path.join(
    os.path.expanduser("~"), ".cache", "compressive", "jax"
  )


def test_an_unusable_compilation_cache_is_a_warning(tmp_path, capsys):
  (tmp_path / "file").write_text("")
  enabled = jax.config.jax_enable_compilation_cache
  try:
    assert cli.use_compilation_cache(str(tmp_path / "file" / "cache")) == ""
    assert not jax.config.jax_enable_compilation_cache
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("warning: compiling without the compilation cache")
  assert "is a file, not a folder" in err[0]


# train.py with JAX's cache events counted (jax.monitoring): a hit is a program
# loaded from the cache, a miss one compiled and written to it.
COUNTING_TRAIN = textwrap.dedent("""
    import atexit, os, runpy, sys
    import jax.monitoring
    counts = {"hits": 0, "misses": 0, "programs": 0}
    def listener(event, **kwargs):
      if event == "/jax/compilation_cache/cache_hits":
        counts["hits"] += 1
      elif event == "/jax/compilation_cache/cache_misses":
        counts["misses"] += 1
    def programs(event, duration, **kwargs):  # each program compiled or loaded
      if event == "/jax/core/compile/backend_compile_duration":
        counts["programs"] += 1
    jax.monitoring.register_event_listener(listener)
    jax.monitoring.register_event_duration_secs_listener(programs)
    atexit.register(lambda: print("CACHE", counts["hits"], counts["misses"], counts["programs"],
                                  file=sys.stderr))
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python train.py`
    runpy.run_path(sys.argv[0], run_name="__main__")
    """)


def cache_counts(stderr: str) -> tuple[int, int]:
  """(cache hits, cache misses) that COUNTING_TRAIN printed."""
  return program_counts(stderr)[:2]


def program_counts(stderr: str) -> tuple[int, int, int]:
  """(cache hits, cache misses, programs compiled or loaded) that COUNTING_TRAIN printed."""
  line = [line for line in stderr.splitlines() if line.startswith("CACHE ")][-1]
  return tuple(int(n) for n in line.split()[1:])


def cache_entries(path) -> set[str]:
  return set(os.listdir(path)) if os.path.isdir(path) else set()


@pytest.mark.slow
def test_a_warm_run_compiles_nothing(tmp_path):
  config = tmp_path / "tiny.py"
  config.write_text(
    textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {TESTS!r})
      from helpers import tiny_experiment

      def get_config():
        return tiny_experiment(num_train_steps=2, checkpoint_every_steps=2,
                               eval_every_steps=0, log_every_steps=1)
      """)
  )
  cache, jax_cache, ours = tmp_path / "cache", tmp_path / "jax_env", tmp_path / "ours_env"
  # Every program is written, however fast it compiled: counts, not timings.
  env = dict(
    os.environ,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    COMPRESSIVE_COMPILATION_CACHE=str(ours),
    JAX_COMPILATION_CACHE_DIR=str(cache),
  )
  train = [os.path.join(ROOT, "train.py"), f"--config={config}"]

  # Cold: JAX's own JAX_COMPILATION_CACHE_DIR wins over the default and
  # COMPRESSIVE_COMPILATION_CACHE.
  r = python("-c", COUNTING_TRAIN, *train, f"--workdir={tmp_path}/wd1", cwd=tmp_path, env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  _, misses = cache_counts(r.stderr)
  entries = cache_entries(cache)
  assert 0 < len([e for e in entries if e.endswith("-cache")]) <= misses
  assert not cache_entries(ours)

  # Warm, in a new workdir: --compilation_cache wins over everything; every
  # program comes from the cache and nothing new is written.
  env["JAX_COMPILATION_CACHE_DIR"] = str(jax_cache)
  r = python(
    "-c",
    COUNTING_TRAIN,
    *train,
    f"--workdir={tmp_path}/wd2",
    f"--compilation_cache={cache}",
    cwd=tmp_path,
    env=env,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  warm_hits, warm_misses = cache_counts(r.stderr)
  assert warm_hits > 0 and warm_misses == 0, (misses, warm_hits, warm_misses)
  assert cache_entries(cache) == entries
  assert not cache_entries(jax_cache) and not cache_entries(ours)

  # Off: the evaluation of the first run, its programs compiled and none of
  # them looked up or written (an evaluation, not a third training: the
  # same flag: 11 s of CPU here where a training took 33 s).
  r = python(
    "-c",
    COUNTING_TRAIN,
    os.path.join(ROOT, "eval.py"),
    f"--workdir={tmp_path}/wd1",
    "--max_segments=1",
    "--compilation_cache=",
    cwd=tmp_path,
    env=env,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  hits, misses, programs = program_counts(r.stderr)
  assert (hits, misses) == (0, 0) and programs > 0, (hits, misses, programs)
  assert cache_entries(cache) == entries and not cache_entries(jax_cache)


# -- The installed package. ---------------------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """A virtual environment with the package installed from its wheel (built
  from a copy of the sources, so the repository gets no build/ folder) and
  the dependencies of this interpreter's environment (a .pth line: nothing is
  downloaded). Returns (python, site-packages)."""
  # Builds the wheel here, offline, in a process of its own: asked of the
  # metadata, not imported (setuptools' distutils shim refuses to import once
  # another test in this worker has imported the standard library's).
  try:
    setuptools_major = int(importlib.metadata.version("setuptools").split(".")[0])
  except importlib.metadata.PackageNotFoundError:
    setuptools_major = 0
  if setuptools_major < 64:
    pytest.skip("building the wheel offline needs setuptools >= 64")
  tmp = tmp_path_factory.mktemp("installed")
  src = tmp / "src"
  for name in ("pyproject.toml", "README.md", "requirements.txt"):
    os.makedirs(src, exist_ok=True)
    shutil.copy(os.path.join(ROOT, name), src / name)
  for name in ("compressive", "configs"):
    shutil.copytree(
      os.path.join(ROOT, name), src / name, ignore=shutil.ignore_patterns("__pycache__")
    )
  r = python(
    "-m",
    "pip",
    "wheel",
    "--no-deps",
    "--no-build-isolation",
    "--no-index",
    "-w",
    str(tmp / "wheels"),
    str(src),
    cwd=tmp,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  [wheel] = os.listdir(tmp / "wheels")
  venv = tmp / "venv"
  r = python("-m", "venv", "--without-pip", str(venv), cwd=tmp)
  assert r.returncode == 0, r.stderr[-3000:]
  exe = str(venv / "bin" / "python")
  site = subprocess.run(
    [exe, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
    capture_output=True,
    text=True,
    check=True,
  ).stdout.strip()
  deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
  with open(os.path.join(site, "_dependencies.pth"), "w") as f:
    f.write("\n".join(sorted(deps)) + "\n")
  r = python(
    "-m",
    "pip",
    "install",
    "--no-deps",
    "--no-index",
    "--target",
    site,
    str(tmp / "wheels" / wheel),
    cwd=tmp,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return exe, site


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("trained") / "wd")
  train_lib.train_and_evaluate(
    to_train(
      tiny_experiment(
        num_train_steps=2, checkpoint_every_steps=2, eval_every_steps=0, log_every_steps=1
      )
    ),
    workdir,
  )
  return workdir


# docs/EVALUATION.md's "From Python" snippet, with a trained workdir.
EVALUATION_SNIPPET = """
import jax.numpy as jnp
from flax import nnx
import compressive
from compressive.configs import default

cfg = compressive.ModelConfig.from_config(default.get_config().model)
model = compressive.CompressiveTransformer(cfg, rngs=nnx.Rngs(0))
memory = compressive.init_memory(cfg, batch_size=2)          # all slots empty
tokens = jnp.zeros((2, cfg.segment_length), jnp.int32)
start = jnp.array([True, False])                               # row 0 starts a document
logits, memory, aux = model(tokens, memory, start)
print(aux.reconstruction_loss, aux.scalars()["attention_mass/compressed_memory"])

config, trained = compressive.load(WORKDIR)             # a trained model back
"""


@pytest.mark.slow
def test_the_python_snippet_runs_from_an_installed_wheel_elsewhere(installed, trained, tmp_path):
  exe, site = installed
  code = EVALUATION_SNIPPET.replace("WORKDIR", repr(trained)) + textwrap.dedent(f"""
      import os
      from compressive import cli_config
      site = {site!r}
      assert compressive.__file__.startswith(site), compressive.__file__
      shipped = os.path.join(site, "compressive", "configs")
      assert default.__file__.startswith(shipped), default.__file__
      assert cli_config.resolve_config("enwik8") == os.path.join(shipped, "enwik8.py")
      # Nothing is installed under a name as common as `configs`.
      assert not os.path.exists(os.path.join(site, "configs"))
      assert logits.shape == (2, cfg.segment_length, cfg.vocab_size)
      assert config.model.d_model == 32
      # The version, one copy: the package's and its metadata's.
      import importlib.metadata
      assert compressive.__version__ == importlib.metadata.version("compressive") == "0.1.0"
      print("OK")
      """)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  r = subprocess.run(
    [exe, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip().splitlines()[-1] == "OK"


@pytest.mark.slow
def test_the_readmes_first_steps_from_an_installed_wheel_elsewhere(installed, tmp_path):
  # Installed, from a folder of the user's: the index, a tool's usage line,
  # the first training's config as config.json would record it, and a
  # checkout's config path pointing at the name.
  exe, _ = installed
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

  def tool(*args):
    return subprocess.run(
      [exe, "-m", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )

  r = tool("compressive")
  assert r.returncode == 0 and "python -m compressive.train" in r.stdout, r.stderr[-2000:]
  r = tool("compressive.train", "--help")
  assert r.returncode == 0 and r.stdout.splitlines()[2].strip() == (
    "python -m compressive.train --config=NAME --workdir=DIR"
  ), r.stdout[:500]
  r = tool("compressive.train", "--config=default", "--workdir=runs/default", "--print_config")
  assert r.returncode == 0 and json.loads(r.stdout)["model"]["d_model"] == 256, r.stderr[-2000:]
  r = tool("compressive.train", "--config=configs/default.py", "--workdir=runs/default")
  assert r.returncode == 2 and r.stderr.strip().endswith(
    "; the shipped config of that name is --config=default"
  ), r.stderr


# -- The package's metadata: ranges that the tested stacks reach. -------------------


def _pins(*names: str) -> dict[str, str]:
  """name -> version of the `name==version` lines of requirements files."""
  pins = {}
  for name in names:
    with open(os.path.join(ROOT, name)) as f:
      for line in f:
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
          package, version = line.split("==")
          pins[canonicalize_name(package)] = version
  return pins


def _declared() -> dict[str, SpecifierSet]:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  requirements = [Requirement(r) for r in project["dependencies"]]
  requirements += [
    Requirement(r) for extra in project["optional-dependencies"].values() for r in extra
  ]
  return {canonicalize_name(r.name): r.specifier for r in requirements}


# Released with JAX: no upper end, so that `pip install .` never downgrades
# the JAX (and the accelerator plugin) a user installed; CI tests the newest
# releases these ranges admit (`make smoke-newest`).
UNCAPPED = {"jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain"}


def test_the_metadata_declares_ranges_whose_ends_the_stacks_test():
  # make test installs requirements.txt's pins: each range's lower end;
  # make test-jax012 replaces the pins its file names: the newest releases,
  # inside each range. No range is a pin, so `pip install .` keeps the JAX a
  # user installed for their hardware.
  declared = _declared()
  lowest = _pins(
    "requirements.txt", "requirements-pg19.txt", "requirements-gcs.txt", "requirements-extras.txt"
  )
  newest = {**lowest, **_pins("requirements-jax012.txt")}
  assert set(lowest) <= set(declared) and set(declared) <= set(lowest)
  for name, spec in declared.items():
    bounds = {s.operator: s.version for s in spec}
    assert bounds[">="] == lowest[name], name  # the lower end is the tested pin
    assert "==" not in bounds and newest[name] in spec, name
    assert set(bounds) == {">="} or (name not in UNCAPPED and set(bounds) == {">=", "<"}), name
  # A JAX the package has not seen yet is admitted, not downgraded.
  assert all(declared[n].contains("1.0.0") for n in ("jax", "jaxlib", "flax"))
  for stack in ("requirements-jax011.txt", "requirements-jax012.txt"):
    assert all(v in declared[n] for n, v in _pins(stack).items()), stack
