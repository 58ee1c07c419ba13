"""Where a recalled fact is lost: in the compressed slot, or by the query.

`recall_probe` streams a `recall` split as evaluation does and, for every
answer byte whose fact's value byte lies in the compressed memory when the
answer is predicted, asks two questions of each layer:

- Is the value byte in the compressed slot that covers it? A linear probe
  (ridge regression onto the ten digits, features the slot's vector crossed
  with the byte's offset within the slot's group of c) is fitted on the
  even-numbered documents' samples and scored on the odd ones. The same
  probe fitted on control slots (another compressed slot of the same memory,
  one that covers no byte of the fact, labelled with the same digit) is the
  floor: what a slot without the fact, and the probe's own fit, give.
- Does the query find it? The attention from the position that predicts the
  answer byte to the compressed slots, per head: the weight on the slot
  holding the value byte against the mean weight on the other valid
  compressed slots, and how often the head's most attended compressed slot
  covers a byte of the fact (`found`). Each layer reports the head that puts
  the most weight on the value slots over all samples.

With the model's own accuracy on the same answer bytes (overall, when its
best head found the fact, and when it did not), this says which failure a
model has: a slot that lost the digit (probe at its control), or a slot that
keeps it where the query does not look (probe high, `found` low), or a read
that fails after both (both high, accuracy low).

Positions: a segment's inputs are document positions [P, P + T); before it
the memory holds [P - M, P) and the compressed memory [P - M - cC, P - M) in
C groups of c consecutive positions, oldest first (a segment evicts its
oldest T slots, T a multiple of c, so groups never straddle an eviction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from compressive import experiment as experiment_lib
from compressive.data import recall as recall_data
from compressive.evaluation import evaluate as eval_lib

if TYPE_CHECKING:
  from compressive.model.transformer import CompressiveTransformer

_QUERY_PREFIX = 1 + recall_data.KEY_LEN + 1  # "<KEY?" before a query's answer
_LAMBDAS = (1.0, 10.0, 100.0, 1000.0)  # ridge penalties tried, on standardised features


def recall_probe(
  model: CompressiveTransformer,
  documents: recall_data.RecallDocuments,
  experiment: experiment_lib.Experiment,
  *,
  max_segments: Optional[int] = None,
  progress_every_s: float = 10.0,
  seed: int = 0,
) -> dict:
  """The probe and attention measurements by distance (module docstring).

  Returns {"distance": [...], "samples": [...] (test samples per distance),
  "accuracy": [...] (the model's, on those answer bytes), "layers": [per
  layer {"probe", "probe_control", "value_weight", "other_weight", "found",
  "accuracy_if_found", "accuracy_if_not_found", "best_head",
  "probe_penalty", and every head's "value_weight_by_head",
  "other_weight_by_head" and "found_by_head"}], "compression_rate",
  "chance"}; each list runs over
  "distance". Distances with no answer byte in the compressed memory are
  left out.
  """
  cfg, sizes = experiment.model, experiment.eval
  c, m_len, c_len = cfg.compression_rate, sizes.memory_length, sizes.compressed_memory_length
  if not c_len:
    raise ValueError(
      "the probe reads the compressed memory: this model evaluates without one "
      "(compressed_memory_length=0)"
    )
  rng = np.random.default_rng(seed)
  answers = _answers(documents)
  rows: list[dict] = []  # one per answer byte in the compressed memory
  docs_seen = row_pos = None
  for segment in eval_lib.stream(
    model,
    documents,
    experiment,
    max_segments=max_segments,
    per_token=True,
    probe=True,
    progress_every_s=progress_every_s,
    what="recall_probe",
  ):
    sos = np.asarray(segment.batch["start_of_sequence"])
    if docs_seen is None:
      docs_seen, row_pos = np.zeros(len(sos), np.int64), np.zeros(len(sos), np.int64)
    assert row_pos is not None
    docs_seen += sos
    row_pos[sos] = 0
    rows += _segment_samples(segment, answers, docs_seen, row_pos, (c, m_len, c_len), rng)
    row_pos += sizes.segment_length
  if not rows:
    raise ValueError(
      "no answer byte's value was in the compressed memory: evaluate longer "
      "documents, more segments, or a model whose compressed memory reaches "
      "the split's distances"
    )
  return _summarise(rows, c, cfg.num_layers)


def _segment_samples(
  segment: eval_lib.Segment,
  answers: list[dict[int, tuple[int, int, int, tuple[int, int]]]],
  docs_seen: np.ndarray,
  row_pos: np.ndarray,
  sizes: tuple[int, int, int],
  rng: np.random.Generator,
) -> list[dict]:
  """One sample per answer byte of the segment whose value byte is in the
  compressed memory: its slot and a control slot of every layer, the
  weights on them, and whether the model predicted the byte. `sizes` is (c,
  M, C); `docs_seen` and `row_pos` say which document each row reads and
  where the segment starts in it."""
  c, m_len, c_len = sizes
  b, t = np.asarray(segment.correct).shape
  slots = weights = None  # read from the device only when a segment needs them
  correct, mask = np.asarray(segment.correct), np.asarray(segment.batch["mask"])
  valid = np.asarray(segment.memory_valid)[:, :c_len]  # [B, C]
  rows = []
  for r in (r for r in range(b) if docs_seen[r]):
    doc = r + b * (int(docs_seen[r]) - 1)
    start = int(row_pos[r]) - m_len - c * c_len  # the oldest compressed slot's first position
    for j in range(t):
      answer = answers[doc].get(int(row_pos[r]) + j + 1)
      if answer is None or not mask[r, j]:
        continue
      placed = _placed(answer, start, c, c_len, valid[r])
      if placed is None:
        continue
      if slots is None:
        slots = np.asarray(segment.compressed_slots, np.float32)  # [L, B, C, d]
        weights = np.asarray(segment.compressed_weights, np.float32)  # [L, B, H, T, C]
      assert weights is not None
      w = weights[:, r, :, j, :]  # [L, H, C]
      rows.append(_sample(doc, answer, start, c, bool(correct[r, j]), placed, slots[:, r], w, rng))
  return rows


def _placed(
  answer: tuple[int, int, int, tuple[int, int]],
  start: int,
  c: int,
  c_len: int,
  valid: np.ndarray,
) -> Optional[tuple[int, list[int], list[int]]]:
  """Where an answer byte's fact lies in a row's compressed memory, whose
  oldest slot starts at position `start` (`valid` [C] its slots that hold
  something): (the slot holding the value byte, the slots covering a byte
  of the fact, the other valid slots: the controls). None when the value
  byte is not in the compressed memory, or no other slot is valid."""
  _, _, value_at, fact = answer
  slot = (value_at - start) // c
  if value_at < start or slot >= c_len or not valid[slot]:
    return None  # the value byte is not in the compressed memory here
  fact_slots = sorted({(p - start) // c for p in range(*fact) if start <= p < start + c * c_len})
  others = [i for i in range(c_len) if valid[i] and i not in fact_slots]
  if not others:
    return None
  return slot, fact_slots, others


def _sample(
  doc: int,
  answer: tuple[int, int, int, tuple[int, int]],
  start: int,
  c: int,
  correct: bool,
  placed: tuple[int, list[int], list[int]],
  slots: np.ndarray,
  w: np.ndarray,
  rng: np.random.Generator,
) -> dict:
  """One answer byte's sample (`_segment_samples`): `placed` its slots
  (`_placed`), `slots` [L, C, d] its row's compressed slots, `w` [L, H, C]
  the weights on them from the position that predicts it; the control slot
  is drawn from `rng`."""
  distance, digit, value_at, _ = answer
  slot, fact_slots, others = placed
  return dict(
    doc=doc,
    distance=distance,
    digit=digit,
    offset=(value_at - start) % c,
    correct=correct,
    slot=slots[:, slot],
    control=slots[:, int(rng.choice(others))],
    value_weight=w[:, :, slot],
    other_weight=w[:, :, others].mean(-1),
    found=np.isin(w.argmax(-1), fact_slots),  # each layer's and head's top slot
  )


def _answers(
  documents: recall_data.RecallDocuments,
) -> list[dict[int, tuple[int, int, int, tuple[int, int]]]]:
  """Per document: the position of each answer byte -> (distance, digit, the
  position of the same value byte in the latest earlier occurrence, that
  occurrence's span [start, end))."""
  out = []
  for i in range(len(documents)):
    text = documents.text(i)
    table = {}
    for q in documents.queries(i):
      query_start = q.answer_start - _QUERY_PREFIX
      before = query_start - q.distance  # the fact (or the fact's previous query)
      span = (before, before + recall_data.event_length(q.value_len))
      for k in range(q.value_len):
        table[q.answer_start + k] = (
          q.distance,
          int(text[q.answer_start + k]),
          before + _QUERY_PREFIX + k,
          span,
        )
    out.append(table)
  return out


def _ridge_probe(
  x: np.ndarray, y: np.ndarray, train: np.ndarray, choose: np.ndarray
) -> tuple[np.ndarray, float]:
  """Fits ridge regression of one-hot digits on `x`'s rows `train`, its
  penalty chosen on the rows `choose` (a part of the training documents),
  then refitted on them all; (predicted digit of every row, the penalty)."""
  mean, std = x[train].mean(0), x[train].std(0) + 1e-6
  z = (x - mean) / std
  z = np.concatenate([z, np.ones((len(z), 1), z.dtype)], 1)
  target = np.eye(10, dtype=np.float64)[y]

  def fit(rows: np.ndarray, lam: float) -> np.ndarray:
    a = z[rows].astype(np.float64)
    gram = a.T @ a + lam * np.eye(a.shape[1])
    return np.linalg.solve(gram, a.T @ target[rows])

  fit_rows = train & ~choose
  scores = [np.mean((z[choose] @ fit(fit_rows, lam)).argmax(1) == y[choose]) for lam in _LAMBDAS]
  lam = _LAMBDAS[int(np.argmax(scores))]
  return (z @ fit(train, lam)).argmax(1), lam


def _summarise(rows: list[dict], c: int, num_layers: int) -> dict:
  """`recall_probe`'s result from the samples `rows`: probes fitted on the
  even-numbered documents' samples, everything measured on the odd ones'."""
  distance = np.array([s["distance"] for s in rows])
  digit = np.array([s["digit"] for s in rows])
  offset = np.eye(c, dtype=np.float32)[[s["offset"] for s in rows]]  # [N, c]
  correct = np.array([s["correct"] for s in rows])
  doc = np.array([s["doc"] for s in rows])
  test = doc % 2 == 1
  train = ~test
  choose = train & (doc % 4 == 2)  # a quarter of the documents picks the penalty
  dists = sorted(set(distance[test].tolist()))
  at = {d: test & (distance == d) for d in dists}
  mean_at = lambda v: [float(v[at[d]].mean()) if at[d].any() else None for d in dists]
  layers = []
  for layer in range(num_layers):
    probes = _probes(rows, layer, offset, digit, train, choose)
    value_w = np.stack([s["value_weight"][layer] for s in rows])  # [N, H]
    other_w = np.stack([s["other_weight"][layer] for s in rows])
    found_h = np.stack([s["found"][layer] for s in rows])
    head = int(value_w[train].mean(0).argmax())  # chosen on the training documents
    found = found_h[:, head]
    per_head = lambda v: [mean_at(v[:, h]) for h in range(v.shape[1])]
    layers.append(
      {
        "best_head": head,
        "probe_penalty": probes["slot"][1],
        "probe": mean_at(probes["slot"][0]),
        "probe_control": mean_at(probes["control"][0]),
        "value_weight": mean_at(value_w[:, head]),
        "other_weight": mean_at(other_w[:, head]),
        "found": mean_at(found),
        "accuracy_if_found": _accuracy_where(correct, found, at, dists),
        "accuracy_if_not_found": _accuracy_where(correct, ~found, at, dists),
        # Every head's, [head][distance]: a fact found by a head other than the best.
        "value_weight_by_head": per_head(value_w),
        "other_weight_by_head": per_head(other_w),
        "found_by_head": per_head(found_h),
      }
    )
  return {
    "distance": dists,
    "samples": [int(at[d].sum()) for d in dists],
    "accuracy": mean_at(correct),
    "layers": layers,
    "compression_rate": c,
    "chance": 0.1,
  }


def _probes(
  rows: list[dict],
  layer: int,
  offset: np.ndarray,
  digit: np.ndarray,
  train: np.ndarray,
  choose: np.ndarray,
) -> dict[str, tuple[np.ndarray, float]]:
  """The layer's probe of the value slots ("slot") and of the control slots
  ("control"): (whether it read each sample's digit [N], its penalty), its
  features each slot's vector crossed with the byte's offset [N, c]."""
  probes = {}
  for name in ("slot", "control"):
    vectors = np.stack([s[name][layer] for s in rows])  # [N, d]
    features = (vectors[:, None, :] * offset[:, :, None]).reshape(len(rows), -1)
    predicted, lam = _ridge_probe(features, digit, train, choose)
    probes[name] = (predicted == digit, lam)
  return probes


def _accuracy_where(
  correct: np.ndarray, where: np.ndarray, at: dict[int, np.ndarray], dists: list[int]
) -> list[Optional[float]]:
  """The model's accuracy at each distance over the samples `where` holds
  (`at`: each distance's test samples); None where there are none."""
  return [float(correct[at[d] & where].mean()) if (at[d] & where).any() else None for d in dists]
