"""What the memory does, measured on a checkpoint (paper §5.5).

- `attention_by_bucket`: each layer's average attention weight over position
  buckets of [compressed memory | memory | segment] (6 buckets each by
  default), the paper's §5.5 figure; only rows whose memories are full count,
  so empty slots at document starts do not dilute the averages.
- `loss_by_position`: mean loss by token position within the documents (does
  the loss keep falling as a book goes on?).
- `recall_accuracy`: on the `recall` source, how often the model predicts a
  queried fact's value, by distance between fact and query.

Each streams a split as evaluation does (eval_lib.stream: the evaluation
memory sizes, on the config's mesh) and reads what it measures off the
segments on the host, in one process.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive.evaluation import evaluate as eval_lib
from compressive.model.block import BANKS
from compressive.model.transformer import CompressiveTransformer


def _bucket(values: np.ndarray, buckets: int) -> np.ndarray:
  """[N] -> [buckets] means of contiguous, near-equal chunks (oldest first)."""
  if values.size == 0:
    return np.full(buckets, np.nan)
  return np.array([chunk.mean() for chunk in np.array_split(values, buckets)])


def attention_by_bucket(
  model: CompressiveTransformer,
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
  *,
  buckets: int = 6,
  max_segments: Optional[int] = None,
  progress_every_s: float = 10.0,
) -> dict:
  """Average attention weight per position bucket, per layer (§5.5 figure).

  Returns {"layers": [[3 * buckets values], ...], "mean": [...], "labels": [...],
  "rows": rows counted}. Within a bank, buckets run oldest to newest.
  """
  c_len, m_len = experiment.eval.compressed_memory_length, experiment.eval.memory_length
  total, rows = None, 0
  for segment in eval_lib.stream(
    model,
    documents,
    experiment,
    max_segments=max_segments,
    collect_attention=True,
    progress_every_s=progress_every_s,
    what="attention",
  ):
    full = np.asarray(segment.memory_valid).all(-1)  # [B]
    if not full.any():
      continue
    by_key = np.asarray(segment.attention_by_key, np.float64)  # [L, B, K]
    by_key = by_key[:, full].sum(1)  # [L, K]
    total = by_key if total is None else total + by_key
    rows += int(full.sum())
  if total is None:
    raise ValueError("no segment had full memories: evaluate longer documents or more segments")
  mean_by_key = total / rows
  layers = []
  for per_key in mean_by_key:
    banks = (per_key[:c_len], per_key[c_len : c_len + m_len], per_key[c_len + m_len :])
    layers.append(np.concatenate([_bucket(x, buckets) for x in banks]).tolist())
  labels = [f"{bank}[{i}]" for bank in BANKS for i in range(buckets)]
  return {"layers": layers, "mean": np.mean(layers, 0).tolist(), "labels": labels, "rows": rows}


def _log_bucket(pos: np.ndarray, bucket_tokens: int) -> np.ndarray:
  """Each position's log-spaced bucket: 0 below bucket_tokens, then k + 1
  from bucket_tokens * 2**k (`loss_by_position`)."""
  return np.where(
    pos < bucket_tokens,
    0,
    np.floor(np.log2(np.maximum(pos, 1) / bucket_tokens)).astype(np.int64) + 1,
  )


def loss_by_position(
  model: CompressiveTransformer,
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
  *,
  bucket_tokens: int = 1024,
  max_segments: Optional[int] = None,
  progress_every_s: float = 10.0,
) -> dict:
  """Mean loss (nats) by position within documents, in log-spaced buckets.

  Bucket edges are bucket_tokens * 2**k; returns their start positions, mean
  nats and token counts.
  """
  t = experiment.eval.segment_length
  nats: dict[int, float] = {}
  counts: dict[int, int] = {}
  row_pos = None
  for segment in eval_lib.stream(
    model,
    documents,
    experiment,
    max_segments=max_segments,
    per_token=True,
    progress_every_s=progress_every_s,
    what="loss_by_position",
  ):
    sos = np.asarray(segment.batch["start_of_sequence"])
    row_pos = np.zeros(sos.shape, np.int64) if row_pos is None else row_pos
    row_pos[sos] = 0
    pos = row_pos[:, None] + np.arange(t)[None]  # [B, T] position of each target
    bucket = _log_bucket(pos, bucket_tokens)
    mask = np.asarray(segment.batch["mask"])
    values = np.asarray(segment.nll, np.float64)
    for k in np.unique(bucket[mask]):
      sel = mask & (bucket == k)
      nats[int(k)] = nats.get(int(k), 0.0) + float(values[sel].sum())
      counts[int(k)] = counts.get(int(k), 0) + int(sel.sum())
    row_pos += t
  keys = sorted(nats)
  starts = [0 if k == 0 else bucket_tokens * 2 ** (k - 1) for k in keys]
  return {
    "start": starts,
    "loss": [nats[k] / counts[k] for k in keys],
    "bits": [nats[k] / counts[k] / math.log(2) for k in keys],
    "tokens": [counts[k] for k in keys],
  }


def recall_accuracy(
  model: CompressiveTransformer,
  documents: data_lib.recall.RecallDocuments,
  experiment: experiment_lib.Experiment,
  *,
  max_segments: Optional[int] = None,
  progress_every_s: float = 10.0,
) -> dict:
  """Accuracy on the answers of `recall` documents, by fact-to-query distance.

  Returns {"distance": [...], "byte_accuracy": [...], "exact_match": [...],
  "queries": [...]}: per distance, the share of answer bytes predicted
  (argmax) and of queries with every answer byte right.
  """
  t = experiment.eval.segment_length
  docs_seen: Optional[np.ndarray] = None  # [B]
  row_pos: Optional[np.ndarray] = None  # [B]
  answer_at, num_queries = _answer_positions(documents)
  hits: dict[int, list[int]] = {qid: [] for qid in range(num_queries)}  # -> [correct bytes]
  distance_of, length_of = {}, {}
  for segment in eval_lib.stream(
    model,
    documents,
    experiment,
    max_segments=max_segments,
    per_token=True,
    progress_every_s=progress_every_s,
    what="recall",
  ):
    sos = np.asarray(segment.batch["start_of_sequence"])
    b = len(sos)
    if docs_seen is None:
      docs_seen, row_pos = np.zeros(b, np.int64), np.zeros(b, np.int64)
    assert row_pos is not None  # set with docs_seen
    docs_seen += sos
    row_pos[sos] = 0
    correct = np.asarray(segment.correct)
    mask = np.asarray(segment.batch["mask"])
    # Evaluation order is natural: global row r streams documents r, r + B, ...
    for r in range(b):
      if docs_seen[r] == 0:
        continue
      doc = r + b * (docs_seen[r] - 1)
      table = answer_at[doc]
      for j in range(t):
        pos = row_pos[r] + j + 1  # document position of target j
        if mask[r, j] and pos in table:
          qid, dist, length = table[pos]
          hits[qid].append(int(correct[r, j]))
          distance_of[qid], length_of[qid] = dist, length
    row_pos += t
  return _accuracy_by_distance(hits, distance_of, length_of)


def _answer_positions(
  documents: data_lib.recall.RecallDocuments,
) -> tuple[list[dict[int, tuple[int, int, int]]], int]:
  """Per document, the position of each answer byte -> (query id, distance,
  answer bytes);
  and the number of queries, whose ids are 0, 1, ... in document order."""
  answer_at, num_queries = [], 0
  for i in range(len(documents)):
    table = {}
    for q in documents.queries(i):
      for k in range(q.value_len):
        table[q.answer_start + k] = (num_queries, q.distance, q.value_len)
      num_queries += 1
    answer_at.append(table)
  return answer_at, num_queries


def _accuracy_by_distance(
  hits: dict[int, list[int]], distance_of: dict[int, int], length_of: dict[int, int]
) -> dict:
  """recall_accuracy's result from each query's answer bytes (1: predicted),
  distance and answer length; a query never reached counts nowhere, and one
  whose answer the stream cut short is not a whole answer."""
  by_distance: dict[int, list[tuple[list[int], int]]] = {}
  for qid, dist in distance_of.items():
    by_distance.setdefault(dist, []).append((hits[qid], length_of[qid]))
  dists = sorted(by_distance)
  return {
    "distance": dists,
    "byte_accuracy": [float(np.mean([x for q, _ in by_distance[d] for x in q])) for d in dists],
    "exact_match": [
      float(np.mean([len(q) == n and all(q) for q, n in by_distance[d]])) for d in dists
    ],
    "queries": [len(by_distance[d]) for d in dists],
  }
