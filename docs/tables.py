"""The docs' generated tables, written from the declarations they list.

    .venv/bin/python docs/tables.py    (make docs)

rewrites each table between its markers (`<!-- table: NAME -->` and
`<!-- end table -->`) in the docs below; tests/tools/test_doc_blocks.py
fails while a doc differs from what this writes. A field declared on its
group (compressive/values.py's helpers: its kind, default and range) is in
its table after one run, with no line of the docs written by hand.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script from anywhere in a checkout
  sys.path.insert(0, ROOT)

from compressive import data, values  # noqa: E402
from compressive.data import registry  # noqa: E402


def data_fields() -> list[str]:
  """docs/DATA.md's every data field: the shared ones (DataConfig), then
  each registered source's section, each with its default and what it
  holds."""
  rows = [
    (f"data.{f.name}", f) for f in dataclasses.fields(data.DataConfig) if f.name != "sections"
  ]
  rows += [
    (f"data.{name}.{f.name}", f)
    for name in registry.names()
    for f in dataclasses.fields(registry.get(name).schema)
  ]
  return ["| field | default | holds |", "|---|---|---|"] + [
    f"| `{name}` | `{f.default!r}` | {values.describe(f)} |" for name, f in rows
  ]


# doc (relative to the repository) -> {table name: its rows}
TABLES = {"docs/DATA.md": {"data_fields": data_fields}}
_TABLE = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- end table -->)", re.S)


def render(text: str, tables: dict) -> str:
  """`text` with each marked table's rows replaced by what its function
  writes; KeyError for a marker naming no table."""
  return _TABLE.sub(
    lambda m: m.group(1) + "\n".join(tables[m.group(2)]()) + "\n" + m.group(4), text
  )


def main() -> None:
  for doc, tables in TABLES.items():
    path = os.path.join(ROOT, doc)
    with open(path, encoding="utf-8") as f:
      text = f.read()
    new = render(text, tables)
    if new != text:
      with open(path, "w", encoding="utf-8") as f:
        f.write(new)
      print(f"wrote {doc}")


if __name__ == "__main__":
  main()
