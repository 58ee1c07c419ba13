"""`python -m compressive`: the package's tools, one line each, and how to
run one. Each tool is a module of the package (`python -m
compressive.train --help`); in a checkout, the script of the same name at
the repository root runs the same tool."""

import ast
import importlib.util
import sys

# In the order a run uses them.
TOOLS = ("train", "eval", "sample", "analyze", "export", "train_tokenizer", "aot")


def summary(tool: str) -> str:
  """The first sentence of the tool's docstring, read from its source (an
  import would define the tool's flags)."""
  spec = importlib.util.find_spec(f"compressive.{tool}")
  if spec is None or spec.origin is None:
    return "(not installed)"
  with open(spec.origin, encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  first = " ".join(doc.split("\n\n", 1)[0].split())
  return first.split(": python ", 1)[0].split(" (", 1)[0].rstrip(".")


def index() -> str:
  width = max(map(len, TOOLS))
  lines = ["compressive's tools: python -m compressive.TOOL --help for one's flags", ""]
  lines += [f"  {tool:<{width}}  {summary(tool)}" for tool in TOOLS]
  lines += ["", "A config's fields: python -m compressive.train --config=NAME --print_config"]
  return "\n".join(lines)


if __name__ == "__main__":
  print(index())
  sys.exit(0)
