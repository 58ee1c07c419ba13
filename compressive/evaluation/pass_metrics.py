"""The metrics of an evaluation pass, from the nats and tokens it summed.

`pass_metrics` gives `loss` (nats per predicted token), `bits_per_token`,
`bits_per_byte` and, after a complete pass over a split whose source counts
words, `word_perplexity` (`word_perplexity_of`): the metrics
compressive/evaluation/evaluate.py's `evaluate` reports, described in its
module docstring (docs/PAPER.md §Metrics).
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import jax

from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive.model import losses

_log = logging.getLogger("compressive")


def pass_metrics(
  total_nats: float,
  total_tokens: float,
  complete: bool,
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
  split: str,
  official: Optional[int],
  source: data_lib.registry.Source,
) -> dict[str, float]:
  """The metrics of a pass over `documents`, the `split` of the
  experiment's data `source` (`official` its published word total, or
  None): bits_per_byte after a `complete` pass (or always for the bytes
  tokenizer), and the word perplexity after a complete pass over a split
  whose source counts words."""
  result = {
    "loss": total_nats / max(total_tokens, 1.0),
    "bits_per_token": total_nats / max(total_tokens, 1.0) / losses.LN2,
    "tokens": int(total_tokens),  # a count: exact in float64, shown as one
  }
  if experiment.data.tokenizer == "bytes":
    result["bits_per_byte"] = result["bits_per_token"]
  elif complete:
    num_bytes = sum(documents.num_bytes(i) for i in range(len(documents)))
    result["bits_per_byte"] = total_nats / losses.LN2 / max(num_bytes, 1)
  if complete and (official is not None or source.official_words is not None):
    words = sum(documents.num_words(i) for i in range(len(documents)))
    result.update(word_perplexity_of(total_nats, words, split, official, documents.description))
  return result


def word_perplexity_of(
  total_nats: float, words: int, split: str, official: Optional[int], what: str
) -> dict[str, float]:
  """The word-level perplexity of a complete pass over `split`, whose texts
  hold `words` whitespace-separated words: `word_perplexity`, `words`, and
  where the source publishes the split's total `official` (PG-19's validation
  and test) `words_official`, the normaliser then. A count more than 0.5%
  off the official total is a warning naming both (`what`: the corpus/split).
  No words and no official total: nothing."""
  if official is None:
    return {"word_perplexity": math.exp(total_nats / words), "words": words} if words else {}
  if abs(words - official) > 0.005 * official and jax.process_index() == 0:
    _log.warning(
      "%s: %d words counted in the texts, but the official %s total is %d (%+.2f%%); "
      "word_perplexity is normalised by the official total",
      what,
      words,
      split,
      official,
      100.0 * (words - official) / official,
    )
  return {
    "word_perplexity": math.exp(total_nats / official),
    "words": words,
    "words_official": official,
  }
