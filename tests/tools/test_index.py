"""`python -m compressive` lists every tool of the package, each with its
docstring's first line, and exits 0."""

import contextlib
import io
import os
import runpy
import sys

import pytest

import compressive
from compressive import __main__ as index_lib

PACKAGE = os.path.dirname(compressive.__file__)


def tool_modules() -> set[str]:
  """The package's tools: its modules (or packages) that run one through cli.run."""
  found = set()
  for name in os.listdir(PACKAGE):
    path = os.path.join(PACKAGE, name)
    source = os.path.join(path, "__main__.py") if os.path.isdir(path) else path
    if source.endswith(".py") and os.path.isfile(source) and name != "__main__.py":
      with open(source, encoding="utf-8") as f:
        if "cli.run(main" in f.read():
          found.add(name.removesuffix(".py"))
  return found


def test_the_index_lists_every_tool_with_its_first_line(monkeypatch):
  monkeypatch.delitem(sys.modules, "compressive.__main__")  # run afresh, as `python -m` does
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
    runpy.run_module("compressive", run_name="__main__")
  assert info.value.code == 0
  assert set(index_lib.TOOLS) == tool_modules()  # a new tool must be listed
  lines = out.getvalue().splitlines()
  for tool in index_lib.TOOLS:
    line = next(line for line in lines if line.split()[:1] == [tool])
    summary = line.split(None, 1)[1]
    assert len(summary) > 20 and "(not installed)" not in summary, line
  assert "python -m compressive.TOOL --help" in lines[0]
