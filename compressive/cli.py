"""What the entry points share: user errors as one line and exit code 2.

A user's mistake (a config field, an override, a corpus, a checkpoint) is
printed as `error: ...` with exit code 2 and no traceback; anything else is a
bug and keeps its traceback. The library never reads flags: this module only
turns its exceptions into exits.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from absl import flags

from compressive.errors import EXIT_USER_ERROR, UserError


def fail(message: str, code: int = EXIT_USER_ERROR) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
  """Turns UserError, a missing file and a non-finite loss into one line."""
  from compressive.train_lib import NonFiniteError  # pylint: disable=g-import-not-at-top
  try:
    yield
  except (UserError, FileNotFoundError) as e:
    fail(str(e) or type(e).__name__)
  except NonFiniteError as e:
    fail(str(e), code=1)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad --config override reported in one line
  (ml_collections raises plain exceptions for an unknown field or a wrong
  type, which would otherwise print a traceback)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e).splitlines()[0])
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    text = " ".join(str(e).replace("\\'", "").replace("\\n", " ").replace("'", "").split())
    override = next((a for a in argv[1:] if a.startswith("--config.")), "a --config override")
    fail(f"cannot apply {_culprit(argv, text) or override}: {text}")
  return []  # unreachable


def _culprit(argv: list[str], text: str) -> str:
  """The override whose field the error message names, if one does."""
  for arg in argv[1:]:
    if arg.startswith("--config."):
      name = arg[len("--config."):].split("=", 1)[0]
      if name.split(".")[-1] in text:
        return arg.split("=", 1)[0]
  return ""
