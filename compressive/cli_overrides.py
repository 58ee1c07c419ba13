"""How a --config.X override is read, for compressive/cli_config.py and
compressive/cli.py: one rule for every type, the last value given of a
repeated override wins (ml_collections' own tuple flags accumulate:
`--config.x=(32,) --config.x=(64,)` gave (32, 64)), and a tuple of bare
words, `(tensorboard,wandb)`, is read as its words.

Base layer: it reads nothing but the values it is given.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from absl import flags


class _WholeSequence(flags.ArgumentParser):
  """A tuple's or list's override, read whole: `--config.x=(32,64)`, or one
  element without brackets (`--config.x=32`). Registered for tuple and list
  in place of ml_collections' TupleParser, whose flags accumulate: a field
  read by this parser is an ordinary flag, whose last value wins."""

  def __init__(self, kind: type):
    super().__init__()
    self.kind = kind

  def parse(self, argument: Any) -> Any:
    from ml_collections.config_flags import tuple_parser

    if isinstance(argument, (tuple, list)):
      return self.kind(argument)
    words = _bare_words(argument)
    if words is not None:
      return self.kind(words)
    return self.kind(tuple_parser.TupleParser().parse(argument))

  def flag_type(self) -> str:
    return self.kind.__name__


def _bare_words(argument: Any) -> Optional[tuple]:
  """`(tensorboard,wandb)` (or `[...]`) as the tuple of its elements, each a
  Python literal or else the word itself, when the whole is no literal
  (bare words); None otherwise (ml_collections' parser reads it)."""
  if not (
    isinstance(argument, str) and len(argument) >= 2 and argument[0] + argument[-1] in ("()", "[]")
  ):
    return None
  try:
    ast.literal_eval(argument)
    return None
  except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
    pass
  out = []
  for part in (p.strip() for p in argument[1:-1].split(",")):
    if part:
      out.append(_Literal().parse(part))
  return tuple(out)


class _Literal(flags.ArgumentParser):
  """A field that is None: any Python literal (`3`, `(4,)`, `'a'`, `None`;
  `true` and `false` are booleans), else the text itself, a string."""

  def parse(self, argument: Any) -> Any:
    if not isinstance(argument, str):
      return argument
    try:
      return ast.literal_eval({"true": "True", "false": "False"}.get(argument, argument))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
      return argument

  def flag_type(self) -> str:
    return "literal"


def install_override_rules() -> None:
  """The last value of a repeated override wins, whatever the field's type:
  ml_collections reads tuples (and lists, and None fields, which it cannot
  override at all) with the parsers above. Process-wide; idempotent."""
  from ml_collections import config_flags

  config_flags.register_flag_parser_for_type(tuple, _WholeSequence(tuple))
  config_flags.register_flag_parser_for_type(list, _WholeSequence(list))
  config_flags.register_flag_parser_for_type(type(None), _Literal())
