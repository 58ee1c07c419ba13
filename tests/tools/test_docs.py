"""Docs that cannot drift: README.md, docs/*.md and benchmarks/README.md
checked against the code and against themselves.

What is proved, one test each (every test collects all its problems, one
line each naming the doc file and line, before it fails):

- test_links_resolve: every relative link and image, `[text](path)` or
  `[text](path#anchor)`, names a file of the repository, and its anchor a
  heading of that file (GitHub's heading slugs); URLs are not fetched.
- test_section_references_resolve: every `PATH.md §Heading words`,
  `[text](PATH.md) §Heading words` and bare `§Heading words` (this file)
  names a heading of that file: the words after § must start a heading,
  case-insensitively (`§8` matches "8. Pre-norm ..."; `§1-2` needs 1 and 2),
  matched over the longest run of words that starts one, at least the first.
  A bare § after "paper"/"paper's", and a bare numbered § in docs/PAPER.md
  (whose § numbers are the paper's, as it says), cite the paper and are not
  checked; `§<heading>` is a placeholder. Every `README "Title"` (or
  `PATH.md "Title"`) must name a heading of that file: all its words, from
  the heading's start (a bold paragraph lead is not a heading: no anchor).
- test_commands_parse: every command in a shell code block (fenced with no
  language or sh/bash/shell/console, or indented by 4 spaces and starting
  with a command) is parsed by the real tool, without running it: its flags
  must be defined and its values and --config overrides accepted (a
  --config file loaded, every override applied to it), exactly as the tool
  would (tests/tools/docs_worker.py). `make TARGET` needs the Makefile's target,
  `bash FILE.sh` the file; `pip` is not checked.
- test_prose_flags_exist: every --flag in an inline code span is a flag of
  the tool the span names (`eval.py --split=test`, `python train.py ...`),
  else of a tool named in the same paragraph (a list item and a table row
  are paragraphs; any of those tools, the nearest before the span tried
  first: benchmarks/README.md names accelerator.py, then aot.py, then gives
  accelerator.py's `--cases=...`), else of any tool. A `--config.a.b` must
  be a field of a config in configs/ (the data section with all its
  sources included), and the tool a span names must have a --config. Spans
  that run another program (`pytest -n 2`, `tensorboard --logdir`) are not
  checked, but `make TARGET` needs the target.
- test_checker_catches_planted_mistakes: the same checks, run on a planted
  doc with one mistake of each kind, report each of them.

How commands are read: lines ending in `\\` are joined; `# comments` are
dropped; `&&`, `||`, `;`, `|` and `&` split commands; redirections are
dropped; leading NAME=value assignments and wrappers (srun, taskset, ...)
are skipped to the interpreter; a quoted argument holding a command
(`gcloud ... --command="cd x && python train.py ..."`) is read as one.
`python X.py` (any path ending in a tool's path: `/path/to/repo/train.py`)
and `python -m compressive.X` (the package's entry points, which take the
root script's flags) name a tool; `...` and the brackets of `[--step=N]`
are dropped (they are how the docs write "more" and "optional").

Placeholders: a value that is a $VAR, `<...>`, `...` or a word in capitals
(DIR, N, HOST:PORT, START,END, configs/X.py) stands for the reader's own.
A flag's placeholder is replaced by a value of its type (its smallest
valid number, first choice, `true`; text is kept, as any text parses), so
the parse still proves the flag exists and takes a value. A --config
override's placeholder is not parsed (its type is the field's): the
command is parsed without it, and its field must exist in the config the
command loaded. Concrete values are parsed as given. Commands with --help
or --flagfile (which act while parsed) are checked by flag names only.
Flags named `--xla_*` are XLA's (XLA_FLAGS), not a tool's.

The tools: the root scripts, experiments/run.py and the benchmarks that
read a command line, but benchmarks/peer_pytorch.py (it needs the PyTorch
peer's own venv).

Speed: the tools' flags come from one subprocess (tests/tools/docs_worker.py)
that imports JAX once and forks a process per tool and per command.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Iterator, Optional
import urllib.parse

import pytest

if __name__ == "__main__":  # run as a script (see the end): helpers.py is in the tests folder
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import ROOT as REPO  # noqa: E402
import processes

DOCS = (
  "README.md",
  *sorted(os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/*.md")),
  "benchmarks/README.md",
)

ROOT_TOOLS = (
  "train.py",
  "eval.py",
  "sample.py",
  "analyze.py",
  "export.py",
  "aot.py",
  "train_tokenizer.py",
)


def _reads_command_line(path: str) -> bool:
  with open(path, encoding="utf-8") as f:
    return bool(re.search(r"\bapp\.run\(|ArgumentParser\(", f.read()))


# The benchmarks that read a command line (absl or argparse), but the
# PyTorch peer: it runs in its own venv (torch), started by compare_peer.py.
BENCHMARKS = tuple(
  sorted(
    os.path.relpath(p, REPO)
    for p in glob.glob(f"{REPO}/benchmarks/*.py")
    if _reads_command_line(p) and not p.endswith("peer_pytorch.py")
  )
)
TOOLS = (*ROOT_TOOLS, "experiments/run.py", *BENCHMARKS)
# `python -m compressive.train` etc.: the package's tools, which the root
# scripts run (the same flags).
MODULE_TOOLS = {f"compressive.{tool[:-3]}": tool for tool in ROOT_TOOLS}

SHELL_LANGUAGES = frozenset(("", "sh", "bash", "shell", "console", "zsh"))
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
COMMANDS = frozenset(
  (
    "make",
    "bash",
    "sh",
    "cd",
    "srun",
    "gcloud",
    "taskset",
    "time",
    "nohup",
    "timeout",
    "tensorboard",
    "git",
    "env",
    "source",
    "ssh",
    "mpirun",
  )
)
TOOL_MENTION = re.compile(r"(?<![\w/.-])(/?(?:[\w.-]+/)*[\w-]+\.py)\b|-m\s+(compressive\.\w+)")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs_worker.py")


# -- Reading markdown. ----------------------------------------------------------


@dataclasses.dataclass
class Block:
  """Consecutive lines: a code block (lang None when indented) or a paragraph."""

  lines: list[tuple[int, str]]
  lang: Optional[str] = None

  @property
  def text(self) -> str:
    return "\n".join(text for _, text in self.lines)

  def line_at(self, offset: int) -> int:
    return self.lines[0][0] + self.text.count("\n", 0, offset)


@dataclasses.dataclass
class Doc:
  path: str
  text: str
  headings: list[str]
  code: list[Block]
  paragraphs: list[Block]


def _fenced(lines: list[str], i: int) -> Optional[tuple[Block, int]]:
  m = re.match(r"\s*(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
  if not m:
    return None
  end = i + 1
  while end < len(lines) and not re.fullmatch(
    rf"\s*{m.group(1)[0]}{{{len(m.group(1))},}}\s*", lines[end]
  ):
    end += 1
  return Block(
    [(n + 1, lines[n]) for n in range(i + 1, min(end, len(lines)))], m.group(2).lower()
  ), end + 1


def _indented(lines: list[str], i: int, indent: int) -> tuple[Block, int]:
  end = i
  while end < len(lines) and (lines[end].startswith(" " * indent) or not lines[end].strip()):
    end += 1
  while not lines[end - 1].strip():
    end -= 1
  return Block([(n + 1, lines[n][indent:]) for n in range(i, end)]), end


def parse_markdown(path: str, text: str) -> Doc:
  """Headings, code blocks and prose paragraphs (a list item and a table row
  each one) of a markdown file, CommonMark's rules as far as these docs need:
  an indented code block follows a blank line, indented 4 past the list
  item it is in."""
  lines = text.splitlines()
  doc, para = Doc(path, text, [], [], []), []
  list_indent, blank, i = 0, True, 0

  def flush():
    if para:
      doc.paragraphs.append(Block(list(para)))
      para.clear()

  while i < len(lines):
    line, indent = lines[i], len(lines[i]) - len(lines[i].lstrip(" "))
    fenced = _fenced(lines, i)
    if fenced or not line.strip() or (blank and indent >= list_indent + 4):
      flush()
      if fenced or line.strip():
        block, i = fenced or _indented(lines, i, list_indent + 4)
        doc.code.append(block)
      else:
        i += 1
      blank = not fenced and not line.strip()
      continue
    heading = re.fullmatch(r"#{1,6}\s+(.*?)(\s+#+)?\s*", line)
    item = re.match(r"\s*([-*+]|\d+[.)])\s+", line)
    if heading or item or line.lstrip().startswith("|"):
      flush()
    if heading:
      doc.headings.append(heading.group(1))
      list_indent = 0
    elif item:
      list_indent = len(item.group(0))
    elif indent == 0 and blank:
      list_indent = 0
    para.append((i + 1, line))
    if heading or line.lstrip().startswith("|"):
      flush()
    blank, i = False, i + 1
  flush()
  return doc


@functools.lru_cache(maxsize=None)
def read_doc(path: str) -> Doc:
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    return parse_markdown(path, f.read())


def inline_spans(block: Block) -> Iterator[tuple[int, int, str]]:
  """(start, end, content) of each `code span` in a paragraph."""
  for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", block.text, re.S):
    yield m.start(), m.end(), " ".join(m.group(2).split())


def slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Doc) -> set[str]:
  seen: dict[str, int] = {}
  out = set()
  for heading in doc.headings:
    base = slug(heading)
    out.add(base if base not in seen else f"{base}-{seen[base]}")
    seen[base] = seen.get(base, 0) + 1
  return out


def norm_word(word: str) -> str:
  """A word as § references and headings are compared: lower case, without
  the punctuation around it (`8.` -> `8`, `code),` -> `code`)."""
  m = re.match(r"[\w'.-]*", word.lower().lstrip("([{\"'`*_"))
  return m.group(0).rstrip(".'-")


def heading_match(words: list[str], headings: list[str]) -> int:
  """How many of words (normalized) start the heading they start best."""
  best = 0
  for heading in headings:
    hwords = [w for w in map(norm_word, heading.split()) if w]
    k = 0
    while k < min(len(words), len(hwords)) and words[k] == hwords[k]:
      k += 1
    best = max(best, k)
  return best


# -- Reading shell commands. --------------------------------------------------------


@dataclasses.dataclass
class Invocation:
  """One command the docs show: a tool with its arguments, `make` with its
  targets, a shell script, or a problem found while reading it."""

  kind: str  # "tool" | "make" | "script" | "problem" | "skip" | "flags" (a span's bare flags)
  name: str
  args: tuple[str, ...] = ()


def strip_comment(line: str) -> str:
  quote, prev = None, " "
  for i, c in enumerate(line):
    if quote:
      quote = None if c == quote and prev != "\\" else quote
    elif c in "'\"":
      quote = c
    elif c == "#" and prev.isspace():
      return line[:i]
    prev = c
  return line


def shell_words(line: str) -> list[str]:
  lexer = shlex.shlex(strip_comment(line), posix=True, punctuation_chars=True)
  lexer.whitespace_split, lexer.commenters = True, ""
  return list(lexer)


def simple_commands(words: list[str]) -> Iterator[list[str]]:
  """words split at && || ; | & ( ), without redirections."""
  command: list[str] = []
  i = 0
  while i < len(words):
    word = words[i]
    if re.fullmatch(r"[<>&]*[<>][<>&]*", word):  # a redirection and its target
      if command and command[-1].isdigit():
        command.pop()
      i += 2
      continue
    if re.fullmatch(r"[;&|()]+", word):
      yield command
      command = []
    else:
      command.append(word)
    i += 1
  yield command


def resolve_script(path: str) -> Optional[str]:
  """The tool a script path names: itself, a path ending in a tool's path
  (/path/to/repo/train.py) or a benchmark's bare name; else None."""
  path = os.path.normpath(path)
  if path in TOOLS:
    return path
  if os.path.isabs(path) or not os.path.exists(os.path.join(REPO, path)):
    for tool in TOOLS:
      if path.endswith("/" + tool) or ("/" not in path and os.path.basename(tool) == path):
        return tool
  return None


def doc_args(args: list[str]) -> tuple[str, ...]:
  """A command's arguments without the docs' `...` and `[` `]` of optional ones."""
  args = [re.sub(r"^\[|\]$", "", a) for a in args]
  return tuple(a for a in args if a and a != "...")


def python_invocation(words: list[str]) -> Invocation:
  """`python [options] SCRIPT|-m MODULE args...` (words[0] is the interpreter)."""
  i = 1
  while i < len(words) and words[i].startswith("-") and words[i] not in ("-m", "-c"):
    i += 2 if words[i] in ("-X", "-W") else 1
  if i < len(words) and words[i] == "-c":
    return Invocation("skip", "python -c")
  if i + 1 < len(words) and words[i] == "-m":
    module, rest = words[i + 1], words[i + 2 :]
    if module in MODULE_TOOLS:
      return Invocation("tool", MODULE_TOOLS[module], doc_args(rest))
    if module.startswith("compressive."):
      return Invocation("problem", f"python -m {module}: not an entry point of the package")
    return Invocation("skip", module)
  if i >= len(words) or not words[i].endswith(".py"):
    return Invocation("skip", " ".join(words[:2]))
  tool = resolve_script(words[i])
  if tool is not None:
    return Invocation("tool", tool, doc_args(words[i + 1 :]))
  if not os.path.exists(os.path.join(REPO, words[i])):
    return Invocation("problem", f"{words[i]}: no such script in the repository")
  return Invocation("skip", words[i])


def is_python(word: str) -> bool:
  return bool(re.fullmatch(r"python[\d.]*", os.path.basename(word)))


def invocations(line: str) -> Iterator[Invocation]:
  """The commands of one shell line (continuations joined)."""
  try:
    words = shell_words(line)
  except ValueError as e:
    yield Invocation("problem", f"cannot split into words: {e}")
    return
  for command in simple_commands(words):
    while command and ENV_ASSIGNMENT.fullmatch(command[0]):
      command = command[1:]
    if not command:
      continue
    first = os.path.basename(command[0])
    if first == "make":
      yield Invocation(
        "make", "make", tuple(w for w in command[1:] if not w.startswith("-") and "=" not in w)
      )
    elif first in ("bash", "sh") and len(command) > 1 and command[1].endswith(".sh"):
      yield Invocation("script", command[1])
    elif re.fullmatch(r"pip[\d.]*", first):
      continue
    elif any(is_python(w) for w in command):  # also after a wrapper: srun ... python
      yield python_invocation(command[next(i for i, w in enumerate(command) if is_python(w)) :])
    else:  # a command held in a quoted argument: gcloud ... --command="..."
      for word in command[1:]:
        if re.search(r"\s", word):
          yield from invocations(word.split("=", 1)[1] if word.startswith("-") else word)


def looks_like_command(line: str) -> bool:
  words = line.split()
  while words and ENV_ASSIGNMENT.fullmatch(words[0]):
    words = words[1:]
  return bool(words) and (
    os.path.basename(words[0]) in COMMANDS
    or is_python(words[0])
    or bool(re.fullmatch(r"pip[\d.]*", os.path.basename(words[0])))
  )


def shell_commands(block: Block) -> Iterator[tuple[int, int, str]]:
  """(first line, last line, text) of each command of a shell code block;
  nothing for another block. A `$ ` prompt, where used, marks the commands."""
  lines = [(n, t) for n, t in block.lines if t.strip()]
  if (
    not lines
    or (block.lang is None and not looks_like_command(lines[0][1]))
    or (block.lang is not None and block.lang not in SHELL_LANGUAGES)
  ):
    return
  prompted = any(t.lstrip().startswith("$ ") for _, t in lines)
  i = 0
  while i < len(lines):
    first, text = lines[i]
    if prompted and not text.lstrip().startswith("$ "):
      i += 1
      continue
    text = text.lstrip().removeprefix("$ ")
    while text.endswith("\\") and i + 1 < len(lines):
      i += 1
      text = text[:-1] + lines[i][1]
    yield first, lines[i][0], text
    i += 1


# -- The checks, each yielding one line per problem. ---------------------------------

# A doc with one mistake of each kind (and correct uses around them), checked
# with the real docs by test_checker_catches_planted_mistakes.
PLANTED = """# Planted

## Real heading

See [a file](docs/NO_SUCH.md), [an anchor](README.md#no-such-heading),
[this one](#real-heading), docs/RESULTS.md §99, §Real heading, §Unreal
heading and README "No such section".

    python train.py --config=configs/default.py --workdir=DIR --no_such_flag=1
    .venv/bin/python eval.py --workdir=DIR --split=sideways
    python -m compressive.train --workdir=DIR --config.model.no_such_field=4
    python /path/to/repo/train.py --workdir=DIR --config.model.norm_typo=NORM
    python train.py --config=enwik8 --workdir=DIR --config.seed=SEED --num_processes=N
    make no-such-target

Prose: `sample.py --num_tokens=5 --no_such_sample_flag`, `--config.model.nope=2`.
"""
_PLANTED = {"PLANTED.md": parse_markdown("PLANTED.md", PLANTED)}


def get_doc(path: str) -> Doc:
  return _PLANTED[path] if path in _PLANTED else read_doc(path)


def exists(path: str) -> bool:
  return path in _PLANTED or os.path.exists(os.path.join(REPO, path))


def link_problem(doc: str, target: str) -> Optional[str]:
  if re.match(r"[A-Za-z][\w+.-]*:|//", target):  # a URL
    return None
  path, _, anchor = target.partition("#")
  path = urllib.parse.unquote(path)
  file = (
    path.lstrip("/")
    if path.startswith("/")
    else os.path.normpath(os.path.join(os.path.dirname(doc), path))
    if path
    else doc
  )
  if file.startswith("..") or not exists(file):
    return f"link ({target}): no such file {file}"
  if anchor and file.endswith(".md") and anchor not in anchors(get_doc(file)):
    return f"link ({target}): no heading of {file} has the anchor #{anchor}"
  return None


def link_problems(doc: Doc) -> Iterator[str]:
  for para in doc.paragraphs:
    text = para.text
    for start, end, _ in inline_spans(para):  # no links inside code
      text = text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]
    links = [
      (m.start(), m.group(1))
      for m in re.finditer(
        r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text
      )
    ]
    links += [
      (m.start(), m.group(1)) for m in re.finditer(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)", text, re.M)
    ]  # [ref]: target
    for start, target in links:
      problem = link_problem(doc.path, target)
      if problem:
        yield f"{doc.path}:{para.line_at(start)}: {problem}"


def referenced_file(doc: str, ref: str, linked: bool) -> Optional[str]:
  """The file a reference names: README is README.md; a link's path is the
  doc's; a path in prose the repository's, else the doc's."""
  if ref == "README":
    return "README.md"
  here = os.path.normpath(os.path.join(os.path.dirname(doc), ref))
  for file in (here,) if linked else (os.path.normpath(ref), here):
    if exists(file):
      return file
  return None


SECTION_FILE = re.compile(
  r"(?:\[[^\]]*\]\(([^)\s#]+\.md)(?:#[^)]*)?\)|(?<![\w/.-])"
  r"((?:[\w.-]+/)*[\w.-]+\.md)|\b(README))\s+$"
)


def section_problems(doc: Doc) -> Iterator[str]:
  for m in re.finditer("§", doc.text):
    line = doc.text.count("\n", 0, m.start()) + 1
    before = doc.text[max(0, m.start() - 200) : m.start()]
    raw = doc.text[m.end() : m.end() + 300].split()[:12]
    first = norm_word(raw[0]) if raw and not raw[0].startswith("<") else ""
    named = SECTION_FILE.search(before)
    if not first or (
      not named
      and (
        re.search(r"paper(?:'s)?\s+$", before, re.I)
        or (doc.path == "docs/PAPER.md" and first[0].isdigit())
      )
    ):
      continue  # not a reference, a placeholder, or the paper's own section
    ref = named and next(g for g in named.groups() if g)
    file = referenced_file(doc.path, ref, bool(named.group(1))) if named else doc.path
    shown = f"{ref + ' ' if named else ''}§{raw[0].rstrip(',.;:)]')}"
    if file is None:
      yield f"{doc.path}:{line}: {shown}: no such file {ref}"
      continue
    words = [norm_word(w) for w in raw]
    words = words[: words.index("")] if "" in words else words
    span = re.fullmatch(r"(\d+(?:\.\d+)*)-(\d+(?:\.\d+)*)", first)  # §1-2
    for ref_words in [[span.group(1)], [span.group(2)]] if span else [words]:
      if heading_match(ref_words, get_doc(file).headings) < 1:
        yield f'{doc.path}:{line}: {shown}: no heading of {file} starts with "{ref_words[0]}"'


def quoted_section_problems(doc: Doc) -> Iterator[str]:
  """README "Title" (or PATH.md "Title"): Title must be a heading there."""
  for m in re.finditer(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md|README)\s+\"([^\"]{1,100})\"", doc.text
  ):
    line = doc.text.count("\n", 0, m.start()) + 1
    title = " ".join(m.group(2).split())
    file = referenced_file(doc.path, m.group(1), False)
    words = [w for w in map(norm_word, title.split()) if w]
    if file is None:
      yield f'{doc.path}:{line}: {m.group(1)} "{title}": no such file {m.group(1)}'
    elif heading_match(words, get_doc(file).headings) < len(words):
      yield f'{doc.path}:{line}: {m.group(1)} "{title}": no heading of {file} is "{title}"'


@functools.lru_cache(maxsize=None)
def is_make_target(target: str) -> bool:
  """make itself says (a dry run: nothing is built), so that targets made by
  pattern rules (test-jax012: test-%) count."""
  r = subprocess.run(["make", "-n", "-C", REPO, target], capture_output=True, text=True, timeout=60)
  return r.returncode == 0


def invocation_problem(inv: Invocation) -> Optional[str]:
  """What is wrong with a command other than a tool's, if anything."""
  if inv.kind == "problem":
    return inv.name
  if inv.kind == "script" and not exists(os.path.normpath(inv.name)):
    return f"{inv.name}: no such script in the repository"
  missing = [t for t in inv.args if inv.kind == "make" and not is_make_target(t)]
  return f"make {' '.join(missing)}: no such target in the Makefile" if missing else None


@dataclasses.dataclass
class Command:
  doc: str
  first: int
  last: int
  inv: Invocation


def doc_commands(doc: Doc) -> Iterator[Command]:
  for block in doc.code:
    for first, last, text in shell_commands(block):
      for inv in invocations(text):
        yield Command(doc.path, first, last, inv)


def all_docs() -> list[Doc]:
  return [read_doc(path) for path in DOCS] + list(_PLANTED.values())


@functools.lru_cache(maxsize=None)
def tools_report() -> dict:
  """docs_worker.py's report: every tool's flags, the config fields, and
  the result of parsing every tool command of the docs' code blocks."""
  commands: dict[str, list[list[str]]] = {}
  for doc in all_docs():
    for c in doc_commands(doc):
      if c.inv.kind == "tool" and list(c.inv.args) not in commands.setdefault(c.inv.name, []):
        commands[c.inv.name].append(list(c.inv.args))
  proc = processes.run(
    [sys.executable, WORKER],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    input=json.dumps({"tools": TOOLS, "commands": commands}),
  )
  assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-4000:]
  report = json.loads(proc.stdout.splitlines()[-1])
  assert "fields" in report["fields"], report["fields"]
  for tool, args in commands.items():
    info = report["tools"][tool]
    info["parsed"] = dict(zip(map(tuple, args), info.get("results", [])))
  return report


def flag_problem(flag: str, tools: list[str], named: bool = True) -> Optional[str]:
  """Why --flag (or --flag=value) is not a flag of any of tools, if it is
  not. Unless the tools are `named` in the command itself, a --config.a.b
  override only needs its field to exist (a config flag's meaning is the
  same for every tool that has one)."""
  name = flag[2:].split("=", 1)[0]
  if not name or name.startswith("xla_"):  # XLA's own (XLA_FLAGS)
    return None
  report = tools_report()
  head, _, field = name.partition(".")
  infos = {tool: report["tools"][tool] for tool in tools}
  for tool, info in infos.items():
    if "names" not in info:
      return f"{tool}: cannot read its flags: {info.get('error')}"
  config_flags = {
    f for info in (infos if named else report["tools"]).values() for f in info["config_flags"]
  }
  if field and head in config_flags:
    return (
      None
      if field in report["fields"]["fields"]
      else f"--{name}: no field {field} in any config of configs/"
    )
  if any(
    name in info["names"] or (name.startswith("no") and name[2:] in info["booleans"])
    for info in infos.values()
  ):
    return None
  if len(tools) == len(TOOLS):
    return f"--{name}: not a flag of any tool"
  owners = [tool for tool, info in report["tools"].items() if name in info.get("names", ())]
  where = " or ".join(tools) + ("" if named else ", the tools its paragraph names")
  owned = f" (it is {' and '.join(owners)}'s: name that in the span)" if owners else ""
  return f"--{name}: not a flag of {where}{owned}"


def command_problems(doc: Doc) -> Iterator[str]:
  lines = doc.text.splitlines()
  for c in doc_commands(doc):
    problem = invocation_problem(c.inv)
    if c.inv.kind == "tool":
      info = tools_report()["tools"][c.inv.name]
      result = info.get("parsed", {}).get(c.inv.args, {"error": info.get("error")})
      problem = result["error"]
      if result.get("names_only"):
        problem = next(
          filter(None, (flag_problem(a, [c.inv.name]) for a in c.inv.args if a.startswith("--"))),
          None,
        )
    if problem:
      names = [a.lstrip("-").split("=")[0] for a in c.inv.args if a.startswith("-")]
      culprit = next((n for n in names if n and n in problem), None)
      line = next(
        (n for n in range(c.first, c.last + 1) if culprit and f"-{culprit}" in lines[n - 1]),
        c.first,
      )
      name = f"{c.inv.name}: " if c.inv.kind == "tool" else ""
      yield f"{doc.path}:{line}: {name}{problem}"


def span_invocations(span: str) -> list[Invocation]:
  """The commands in an inline code span; a span that starts with a tool's
  script (`eval.py --split=test`) names that tool without an interpreter."""
  try:
    words = shell_words(span)
  except ValueError:
    words = span.split()
  while words and ENV_ASSIGNMENT.fullmatch(words[0]):
    words = words[1:]
  if not words:
    return []
  tool = resolve_script(words[0]) if words[0].endswith(".py") else None
  if tool is not None:
    return [Invocation("tool", tool, doc_args(words[1:]))]
  if words[0].startswith("--"):
    return [Invocation("flags", "", tuple(words))]
  return list(invocations(span)) if looks_like_command(span) else []


def prose_problems(doc: Doc) -> Iterator[str]:
  for para in doc.paragraphs:
    mentions = [
      (m.start(), tool)
      for m in TOOL_MENTION.finditer(para.text)
      for tool in [resolve_script(m.group(1)) if m.group(1) else MODULE_TOOLS.get(m.group(2))]
      if tool
    ]
    for start, _, span in inline_spans(para):
      for inv in span_invocations(span):
        if inv.kind == "tool" or inv.kind == "flags":
          before = [t for p, t in reversed(mentions) if p < start]
          named = list(dict.fromkeys(before + [t for _, t in mentions]))
          tools = [inv.name] if inv.kind == "tool" else named or list(TOOLS)
          problems = [
            flag_problem(a, tools, inv.kind == "tool") for a in inv.args if a.startswith("--")
          ]
        else:
          problems = [invocation_problem(inv)]
        for problem in filter(None, problems):
          shown = "" if problem.startswith(span.split("=")[0] + ":") else f"`{span}`: "
          yield f"{doc.path}:{para.line_at(start)}: {shown}{problem}"


# -- The tests. ------------------------------------------------------------------


def problems_of(*checks, docs=None) -> list[str]:
  docs = [read_doc(path) for path in DOCS] if docs is None else docs
  return [problem for doc in docs for check in checks for problem in check(doc)]


def fail_on(problems: list[str]) -> None:
  if problems:
    pytest.fail(f"{len(problems)} problem(s) in the docs:\n" + "\n".join(problems), pytrace=False)


def test_links_resolve():
  fail_on(problems_of(link_problems))


def test_section_references_resolve():
  fail_on(problems_of(section_problems, quoted_section_problems))


@pytest.mark.slow
def test_commands_parse():
  fail_on(problems_of(command_problems))


@pytest.mark.slow
def test_prose_flags_exist():
  fail_on(problems_of(prose_problems))


@pytest.mark.slow
def test_checker_catches_planted_mistakes():
  problems = problems_of(
    link_problems,
    section_problems,
    quoted_section_problems,
    command_problems,
    prose_problems,
    docs=list(_PLANTED.values()),
  )
  text = "\n".join(problems)
  for expected in (
    "docs/NO_SUCH.md",
    "#no-such-heading",
    "§99",
    "§Unreal",
    "No such section",
    "'no_such_flag'",
    "sideways",
    "--config.model.no_such_field",
    "norm_typo",
    "no-such-target",
    "--no_such_sample_flag",
    "config.model.nope",
  ):
    assert expected in text, f"not reported: {expected}\n{text}"
  assert len(problems) == 12, text  # and nothing else: the correct uses pass
  assert all(p.startswith("PLANTED.md:") for p in problems), text


if __name__ == "__main__":  # the problems, without pytest
  print(
    "\n".join(
      problems_of(
        link_problems, section_problems, quoted_section_problems, command_problems, prose_problems
      )
    )
  )
