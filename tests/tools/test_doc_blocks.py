"""Every command block of the docs runs as written: each shell block of
README.md, docs/*.md and benchmarks/README.md parses as bash (`bash -n`;
an output block is fenced as `text`), the commands that need no hardware,
no data of the reader's and no minutes (`python -m compressive`, a tool's
`--help`, `--print_config`, `--dry_run`) run as written from a folder of
their own, and SCALING.md's "try it on a laptop" block runs against the
suite's Cloud Storage server, starting from only what the block sets.
(tests/tools/test_docs.py parses every tool command with the tool's own
flags; tests/tools/test_tokenizer_recipe.py runs DATA.md's SentencePiece
recipe.)"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers import ROOT, generated_texts, process_env
import processes

DOCS = (
  "README.md",
  *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md")),
  "benchmarks/README.md",
)
SHELL = ("", "sh", "bash", "shell", "console")
TIMEOUT = 600
# Appended to a training command the tests run, so that it trains in
# seconds (the last value of a field wins).
TINY = [
  "--config.batch_size=4",
  "--config.segments_per_step=1",
  "--config.model.num_layers=1",
  "--config.model.d_model=32",
  "--config.model.d_ff=64",
  "--config.model.num_heads=2",
  "--config.model.segment_length=16",
  "--config.model.memory_length=16",
  "--config.model.compressed_memory_length=8",
  "--config.log_every_steps=2",
  "--config.eval_every_steps=0",
  "--config.eval.max_segments=2",
  "--config.num_train_steps=4",
  "--config.checkpoint_every_steps=2",
]


@dataclasses.dataclass
class Block:
  doc: str
  line: int  # of the opening fence
  lang: str
  text: str  # dedented to the fence's indent


def blocks() -> list[Block]:
  """Every fenced code block of the docs (a fence may be indented in a list)."""
  found = []
  for doc in DOCS:
    lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
      fence = re.match(r"^( *)(`{3,})(\S*)\s*$", lines[i])
      if not fence:
        i += 1
        continue
      indent, ticks, lang = len(fence.group(1)), fence.group(2), fence.group(3)
      j = i + 1
      while j < len(lines) and not lines[j].strip().startswith(ticks):
        j += 1
      body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1 : j]]
      found.append(Block(doc, i + 1, lang, "\n".join(body) + "\n"))
      i = j + 1
  return found


def shell_blocks() -> list[Block]:
  return [b for b in blocks() if b.lang in SHELL]


def commands(block: Block) -> list[list[str]]:
  """The block's commands, each as its words: continuation lines joined,
  comments and blank lines dropped, `&&` and `;` split."""
  out, pending = [], ""
  for line in block.text.replace("\\\n", " ").splitlines():
    pending += line + "\n"
    try:
      words = shlex.split(pending, comments=True)
    except ValueError:  # a quote that a later line closes
      continue
    pending = ""
    current: list[str] = []
    for word in words:
      if word in ("&&", ";", "||"):
        out.append(current)
        current = []
      else:
        current.append(word)
    if current:
      out.append(current)
  return out


@pytest.mark.slow
def test_every_shell_block_parses_as_bash(tmp_path):
  found = shell_blocks()
  assert len(found) >= 30 and {b.doc for b in found} >= {"README.md", "docs/SCALING.md"}
  problems = []
  for n, block in enumerate(found):
    script = tmp_path / f"block{n}.sh"
    script.write_text(block.text)
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    if r.returncode:
      problems.append(f"{block.doc}:{block.line}: {r.stderr.strip().splitlines()[-1]}")
  assert problems == []


# A tilde in quotes is a tilde, not the home folder (`pip install
# '~/compressive[pg19]'` was `ERROR: Invalid requirement`).
QUOTED_TILDE = re.compile(r"""['"]~""")


def test_no_shell_block_quotes_a_tilde():
  found = [
    f"{b.doc}:{b.line}: {m.group(0)}..."
    for b in shell_blocks()
    for m in QUOTED_TILDE.finditer(b.text)
  ]
  assert found == []
  assert QUOTED_TILDE.search("~/venv/bin/pip install '~/compressive[pg19]'")


@pytest.mark.slow
def test_the_checker_finds_what_bash_would_refuse(tmp_path):
  # The docs' own mistakes, planted: each is a syntax error bash reports.
  for text in (
    'gcloud ssh --command="python -m x\n',
    "python -m x --a=(1,2)\n",
    "if true; then echo\n",
  ):
    (tmp_path / "b.sh").write_text(text)
    r = subprocess.run(["bash", "-n", str(tmp_path / "b.sh")], capture_output=True, timeout=60)
    assert r.returncode != 0, text


def test_output_blocks_are_fenced_as_text_not_as_shell():
  # An unlabelled fence is read as shell: output in one would be parsed as
  # commands.
  for block in [b for b in blocks() if b.lang == ""]:
    first = block.text.strip().splitlines()[0] if block.text.strip() else ""
    assert not first.startswith(("...", "error:", "{", "step ")), f"{block.doc}:{block.line}"


# -- The commands that need nothing but the package, as written. ---------------------

ROOT_TOOLS = (
  "train.py",
  "eval.py",
  "sample.py",
  "analyze.py",
  "export.py",
  "aot.py",
  "train_tokenizer.py",
)
QUICK = ("--help", "--print_config", "--dry_run", "--target=list")


def argv(words: list[str]) -> list[str] | None:
  """The command as this interpreter runs it (`python` and `.venv/bin/python`
  are it; a root script by its path in the repository), or None when it is
  not a tool of the package."""
  if not words or not re.fullmatch(r"(\.venv/bin/)?python3?", words[0]):
    return None
  rest = words[1:]
  if (
    rest[:1] == ["-m"]
    and len(rest) > 1
    and (rest[1] == "compressive" or rest[1].startswith("compressive."))
  ):
    return [sys.executable, *rest]
  if rest and rest[0] in ROOT_TOOLS:
    return [sys.executable, os.path.join(ROOT, rest[0]), *rest[1:]]
  return None


LOCAL_DATA = ("--config.data.source=text_files", "--config.data.source=synthetic")
READERS = ("eval", "sample", "analyze", "export")


def tool_of(words: list[str]) -> str:
  """train, eval, ...: the tool a command runs."""
  command = argv(words) or []
  name = command[2] if command[1:2] == ["-m"] else os.path.basename(command[1])
  return name.removeprefix("compressive.").removesuffix(".py")


def runs_here(words: list[str], trained: set[str]) -> bool:
  """A command that needs no hardware, no data of the reader's but a text
  file (input.txt) and no minutes: the package's index, a tool asked to
  check or show rather than to work, a training on local data (made tiny:
  TINY), and a reader of a workdir such a training made."""
  if argv(words) is None or any(
    w.startswith(("--config.data.pg19.", "--config.data.enwik8.path", "--workdir=gs://"))
    for w in words
  ):
    return False
  if words[1:] == ["-m", "compressive"] or any(w in QUICK for w in words):
    return True
  if tool_of(words) in ("train", "train_tokenizer"):
    return any(w in LOCAL_DATA for w in words)
  workdir = next((w.split("=", 1)[1] for w in words if w.startswith("--workdir=")), None)
  return tool_of(words) in READERS and workdir in trained


@pytest.mark.slow
def test_the_local_commands_run_as_written(tmp_path):
  # Each block from a folder of its own, holding the one file the docs ask
  # the reader for (input.txt, their own text).
  text = "\n\n".join(generated_texts(400))
  ran, failed, trained = [], [], set()
  for n, block in enumerate(shell_blocks()):
    folder = tmp_path / f"block{n}"
    folder.mkdir()
    (folder / "input.txt").write_text(text)
    trained.clear()
    for words in commands(block):
      if not runs_here(words, trained):
        continue
      quick = any(w in QUICK for w in words)
      extra = TINY if tool_of(words) == "train" and not quick else []
      r = processes.run(
        argv(words) + extra,
        cwd=folder,
        capture_output=True,
        text=True,
        env=process_env(),
        timeout=TIMEOUT,
      )
      ran.append(f"{block.doc}:{block.line}: {' '.join(words)}")
      if r.returncode != 0:
        failed.append(f"{ran[-1]}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
      elif extra:
        trained.update(w.split("=", 1)[1] for w in words if w.startswith("--workdir="))
  assert failed == []
  assert any(r.endswith(": python -m compressive") for r in ran), ran
  assert any("--print_config" in r for r in ran) and any("--dry_run" in r for r in ran), ran
  assert any("compressive.eval --workdir=runs/mine" in r for r in ran), ran
  assert any("sample.py --workdir=runs/mine_spm" in r for r in ran), ran


# -- SCALING.md: Cloud Storage on a laptop. --------------------------------------------

# What the suite's server stands for in the block: its start, and the bucket
# it makes (each done here the suite's way, with the block's own values).
EMULATOR = re.compile(r"^docker run .*fake-gcs-server")


def laptop_block() -> Block:
  [block] = [
    b
    for b in shell_blocks()
    if b.doc == "docs/SCALING.md" and "export STORAGE_EMULATOR_HOST" in b.text
  ]
  return block


@pytest.mark.slow
def test_the_cloud_storage_block_runs_on_the_suites_server(tmp_path):
  import gcs_server

  block = laptop_block()
  steps = commands(block)
  assert EMULATOR.match(" ".join(steps[0])), steps[0]
  port = re.search(r"-p (\d+):", " ".join(steps[0])).group(1)
  # The environment: this one without anything of Cloud Storage's, then
  # only what the block exports.
  env = process_env()
  for name in (
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
    "EPATH_USE_TF",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
    "no_proxy",
    "NO_PROXY",
    "GOOGLE_APPLICATION_CREDENTIALS",
  ):
    env.pop(name, None)
  env["HOME"] = str(tmp_path)  # no credentials of the machine's
  with gcs_server.serve() as server:
    here = server.url.rsplit(":", 1)[1]
    said = {}
    ran = []
    for words in steps[1:]:
      words = [w.replace(f"127.0.0.1:{port}", f"127.0.0.1:{here}") for w in words]
      if words[0] == "export":
        said.update(w.split("=", 1) for w in words[1:])
        continue
      if words[0] == "curl":
        bucket = json.loads(words[words.index("-d") + 1])["name"]
        url = words[-1]
        assert url == f"{server.url}/storage/v1/b"
        server.create_bucket(bucket)
        continue
      command = argv(words)
      assert command is not None, words
      extra = TINY if words[2] == "compressive.train" else []
      r = processes.run(
        command + extra,
        cwd=tmp_path,
        env={**env, **said},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
      )
      assert r.returncode == 0, (words, r.stderr[-3000:])
      assert "google_auth_provider" not in r.stderr, r.stderr[-2000:]
      ran.append((words[2], r))
  assert set(said) >= {
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
  }
  tools = [name for name, _ in ran]
  assert tools == ["compressive.train", "compressive.eval", "compressive.export"], tools
  result = json.loads(ran[1][1].stdout.strip().splitlines()[-1])
  assert result["split"] == "test" and result["step"] == 4
  assert "result: gs://runs/try/eval_test_step4.json" in ran[1][1].stderr
  exported = json.loads(ran[2][1].stdout.strip().splitlines()[-1])
  assert exported["output"] == "gs://runs/try_export"


# -- The tables written from the declarations. ------------------------------------


def _tables():
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "doc_tables", os.path.join(ROOT, "docs", "tables.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_generated_tables_are_what_the_declarations_write():
  # DATA.md's every data field is written from the fields' declarations
  # (docs/tables.py, `make docs`): a field declared on a group or a source's
  # schema is listed, with its default and range, by one run of it.
  tables = _tables()
  for doc, names in tables.TABLES.items():
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
      text = f.read()
    assert all(f"<!-- table: {name} -->" in text for name in names), doc
    assert tables.render(text, names) == text, f"{doc} is not current: run make docs"


def test_a_table_is_rewritten_between_its_markers_only():
  tables = _tables()
  text = "intro\n<!-- table: t -->\n| old |\n<!-- end table -->\nafter\n"
  assert tables.render(text, {"t": lambda: ["| a |", "| b |"]}) == (
    "intro\n<!-- table: t -->\n| a |\n| b |\n<!-- end table -->\nafter\n"
  )
  with pytest.raises(KeyError):
    tables.render(text, {})
  rows = tables.data_fields()
  assert "| `data.recall.value_len` | `4` | an integer in [1, 16] |" in rows
  assert "| `data.tokenizer` | `'bytes'` | one of 'bytes', 'sentencepiece' |" in rows
