"""SegmentIterator: the promises of docs/DESIGN.md §Path of data, checked directly.

Documents are reassembled from batches (first input token, then every masked
target) and compared with the documents the assignment rule says each row
must read, which checks at once that rows are pinned to documents, that
start_of_sequence marks every document boundary and nothing else, and that
no token is lost or repeated.
"""

import numpy as np
import pytest

from compressive import data
from compressive.data import documents as documents_lib


def make_docs(lengths, seed=0, vocab=50):
  rng = np.random.default_rng(seed)
  # Each document starts with a distinct marker so it can be identified.
  docs = []
  for i, n in enumerate(lengths):
    doc = rng.integers(1, vocab, size=n).astype(np.int32)
    doc[0] = 1000 + i
    docs.append(doc)
  return data.TokenDocuments(docs, description="test/train")


def reassemble(batches):
  """Per row: the list of documents read, rebuilt from the batches.

  Also checks the batch format: dtypes, shapes, padding as a suffix, and
  that a row continues a document exactly where its last segment stopped.
  """
  rows = None
  for batch in batches:
    inputs, targets = batch["inputs"], batch["targets"]
    mask, start = batch["mask"], batch["start_of_sequence"]
    assert inputs.dtype == np.int32 and targets.dtype == np.int32
    assert mask.dtype == bool and start.dtype == bool
    b, t = inputs.shape
    assert targets.shape == mask.shape == (b, t) and start.shape == (b,)
    if rows is None:
      rows = [[] for _ in range(b)]
    for j in range(b):
      n = int(mask[j].sum())
      assert mask[j, :n].all() and not mask[j, n:].any()  # Padding is a suffix.
      assert not inputs[j, n:].any() and not targets[j, n:].any()
      if n == 0:
        assert not start[j]
        continue
      # Within a segment, inputs are targets shifted by one.
      np.testing.assert_array_equal(inputs[j, 1:n], targets[j, : n - 1])
      if start[j]:
        rows[j].append([int(inputs[j, 0])])
      else:
        assert rows[j], "a row continued a document it never started"
        assert rows[j][-1][-1] == inputs[j, 0]  # Continues where it stopped.
      rows[j][-1].extend(int(x) for x in targets[j, :n])
  return rows


def expected_row_docs(docs, batch_size, row, epochs, seed=0, shuffle=True):
  out = []
  for e in range(epochs):
    perm = data.epoch_permutation(seed, e, len(docs)) if shuffle else np.arange(len(docs))
    out.extend(int(perm[p]) for p in range(row, len(docs), batch_size))
  return out


def run_until_epoch(it, epoch, max_steps=10_000):
  """Batches until every row has started `epoch` (state says so)."""
  batches = []
  while it.get_state()["epoch"].min() < epoch:
    batches.append(next(it))
    assert len(batches) < max_steps
  return batches


LENGTHS = [2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 40, 5, 64, 2, 11, 29, 12, 50]


def test_rows_pinned_no_token_lost_or_repeated_in_an_epoch():
  docs = make_docs(LENGTHS)
  b, t = 4, 8
  it = data.SegmentIterator(docs, batch_size=b, segment_length=t, seed=3)
  rows = reassemble(run_until_epoch(it, 1))
  seen = []
  for r in range(b):
    expected = expected_row_docs(docs, b, r, epochs=1, seed=3)
    # A row may already have begun its epoch-1 documents: compare the prefix.
    got = rows[r][: len(expected)]
    assert [g[0] - 1000 for g in got] == expected
    for i, tokens in zip(expected, got):
      np.testing.assert_array_equal(tokens, docs.tokens(i))
    seen.extend(expected)
  assert sorted(seen) == list(range(len(docs)))  # Each document once.


def test_per_row_epochs_continue_into_next_epoch():
  docs = make_docs(LENGTHS)
  b = 5  # 18 docs: rows get 4 or 3 documents an epoch, drift apart.
  it = data.SegmentIterator(docs, batch_size=b, segment_length=4, seed=1)
  rows = reassemble(run_until_epoch(it, 3))
  for r in range(b):
    expected = expected_row_docs(docs, b, r, epochs=3, seed=1)
    got = [g[0] - 1000 for g in rows[r]]
    assert got[: len(expected)] == expected
    for i, tokens in zip(got, rows[r]):
      if len(tokens) == len(docs.tokens(i)):  # Completed documents.
        np.testing.assert_array_equal(tokens, docs.tokens(i))


def test_start_of_sequence_exactly_at_document_starts():
  docs = make_docs([9, 9, 17, 2, 8, 25])
  it = data.SegmentIterator(docs, batch_size=2, segment_length=8, seed=0, repeat=False)
  batches = list(it)
  for r in range(2):
    starts = [bool(bt["start_of_sequence"][r]) for bt in batches]
    # Expected: first segment of each doc; a doc of L tokens takes
    # ceil((L-1)/8) segments.
    expected = []
    for i in range(r, 6, 2):
      segments = -(-(len(docs.tokens(i)) - 1) // 8)
      expected += [True] + [False] * (segments - 1)
    expected += [False] * (len(batches) - len(expected))  # Padding rows.
    assert starts == expected


def test_determinism_and_seed_changes_order():
  docs = make_docs(LENGTHS)

  def first(seed, steps=12):
    it = data.SegmentIterator(docs, batch_size=3, segment_length=8, seed=seed)
    return [next(it) for _ in range(steps)]

  a, a2, c = first(0), first(0), first(1)
  for x, y in zip(a, a2):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert any(not np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c))
  assert not np.array_equal(data.epoch_permutation(0, 0, 18), data.epoch_permutation(1, 0, 18))
  assert not np.array_equal(data.epoch_permutation(0, 0, 18), data.epoch_permutation(0, 1, 18))


def test_epoch_permutation_is_pinned():
  # The order is part of a checkpoint's meaning: changing it silently would
  # make resumed runs read different documents.
  perm = data.epoch_permutation(0, 0, 10)
  assert sorted(perm.tolist()) == list(range(10))
  assert perm.tolist() == PINNED_PERMUTATION
  assert data.epoch_permutation(7, 3, 1000).dtype == np.int64


PINNED_PERMUTATION = [0, 9, 1, 6, 3, 5, 4, 2, 8, 7]


def test_state_resumes_exactly_mid_epoch():
  docs = make_docs(LENGTHS)
  kwargs = dict(batch_size=4, segment_length=5, seed=11)
  it = data.SegmentIterator(docs, **kwargs)
  for _ in range(7):
    next(it)
  state = it.get_state()
  assert all(isinstance(v, np.ndarray) and v.dtype == np.int64 for v in state.values())
  # As after a checkpoint round trip: copies, scalars as 0-d arrays.
  state = {k: np.array(v) for k, v in state.items()}
  expected = [next(it) for _ in range(40)]  # Crosses into epoch 1 and 2.
  resumed = data.SegmentIterator(docs, **kwargs)
  resumed.set_state(state)
  for x in expected:
    y = next(resumed)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert int(resumed.get_state()["step"]) == 47


def test_state_from_other_iterator_is_rejected():
  docs = make_docs(LENGTHS)
  it = data.SegmentIterator(docs, batch_size=4, segment_length=5, seed=11)
  other = data.SegmentIterator(docs, batch_size=4, segment_length=6, seed=11)
  with pytest.raises(ValueError, match="segment_length"):
    other.set_state(it.get_state())


def test_evaluation_pass_sees_each_document_once_then_stops():
  docs = make_docs(LENGTHS)
  b = 4
  it = data.SegmentIterator(docs, batch_size=b, segment_length=8, repeat=False)
  batches = list(it)
  assert len(batches) == it.num_batches
  rows = reassemble(batches)
  seen = []
  for r in range(b):
    expected = list(range(r, len(docs), b))  # Natural order, no shuffle.
    assert [g[0] - 1000 for g in rows[r]] == expected
    for i, tokens in zip(expected, rows[r]):
      np.testing.assert_array_equal(tokens, docs.tokens(i))
    seen += expected
  assert sorted(seen) == list(range(len(docs)))
  # The pass is as long as the busiest row: no all-padding batch at the end.
  assert batches[-1]["mask"].any()
  with pytest.raises(StopIteration):
    next(it)
  masked = sum(int(bt["mask"].sum()) for bt in batches)
  assert masked == sum(n - 1 for n in LENGTHS)


def test_evaluation_with_fewer_documents_than_rows():
  docs = make_docs([5, 9, 3])
  it = data.SegmentIterator(docs, batch_size=5, segment_length=4, repeat=False)
  batches = list(it)
  assert len(batches) == 2  # Doc 1 has 8 predictions = 2 segments.
  assert not any(bt["mask"][3:].any() for bt in batches)
  rows = reassemble(batches)
  assert [[g[0] - 1000 for g in row] for row in rows] == [[0], [1], [2], [], []]


def test_empty_evaluation_split_stops_at_once():
  it = data.SegmentIterator(
    data.TokenDocuments([], "x"), batch_size=2, segment_length=4, repeat=False
  )
  assert it.num_batches == 0
  assert list(it) == []


@pytest.mark.parametrize("repeat", [True, False])
def test_process_local_rows_match_global_rows(repeat):
  docs = make_docs(LENGTHS)
  kw = dict(batch_size=6, segment_length=7, seed=5, repeat=repeat)
  full = data.SegmentIterator(docs, **kw)
  parts = [data.SegmentIterator(docs, row_start=s, num_rows=2, **kw) for s in (0, 2, 4)]
  steps = 0
  while True:
    try:
      expected = next(full)
    except StopIteration:
      for p in parts:  # Every process stops at the same step.
        with pytest.raises(StopIteration):
          next(p)
      break
    got = [next(p) for p in parts]
    for k in expected:
      np.testing.assert_array_equal(expected[k], np.concatenate([g[k] for g in got]))
    steps += 1
    if steps == 60:
      assert repeat
      break
  assert steps > 5


def test_one_token_document_is_an_error_naming_it():
  docs = data.TokenDocuments([np.arange(1, 9), np.array([7])], "test/train")
  it = data.SegmentIterator(docs, batch_size=2, segment_length=4, repeat=False)
  with pytest.raises(ValueError, match=r"'test/train\[1\]'.*1 token"):
    next(it)


def test_training_needs_as_many_documents_as_rows():
  docs = make_docs([5, 6, 7])
  with pytest.raises(ValueError, match="at least batch_size documents"):
    data.SegmentIterator(docs, batch_size=4, segment_length=4)


@pytest.mark.parametrize(
  "kw",
  [
    dict(batch_size=0, segment_length=4),
    dict(batch_size=4, segment_length=0),
    dict(batch_size=4, segment_length=4, row_start=3, num_rows=2),
    dict(batch_size=4, segment_length=4, row_start=-1),
    dict(batch_size=4, segment_length=4, seed=-1),
  ],
)
def test_bad_arguments(kw):
  with pytest.raises(ValueError):
    data.SegmentIterator(make_docs(LENGTHS), **kw)


def test_split_by_hash_is_deterministic_disjoint_and_keeps_groups():
  keys = [f"g{i // 2}" for i in range(60)]  # Pairs share a group.
  split = documents_lib.split_by_hash(keys, 0.05)
  again = documents_lib.split_by_hash(list(reversed(keys)), 0.05)
  everything = sorted(split["train"] + split["validation"] + split["test"])
  assert everything == list(range(60))
  for name in ("validation", "test"):
    assert len({keys[i] for i in split[name]}) == 2  # round(0.05 * 30).
    assert {keys[i] for i in split[name]} == {list(reversed(keys))[i] for i in again[name]}
  assert not (
    {keys[i] for i in split["train"]} & {keys[i] for i in split["validation"] + split["test"]}
  )
  with pytest.raises(ValueError, match="at least 3"):
    documents_lib.split_by_hash(["a", "b"], 0.05)


def test_text_documents_counts_tokens_and_cache():
  texts = ["one two  three\n", "ü ★", "a"]
  loads = []

  def load(i):
    loads.append(i)
    return texts[i]

  docs = data.TextDocuments(
    ["a", "b", "c"], load, data.ByteTokenizer(), "test/docs", cache_tokens=8
  )
  # Counts first, tokens after: both must come from the text.
  assert docs.num_words(0) == 3 and docs.num_bytes(0) == 15
  assert len(docs.tokens(0)) == 15 == docs.num_tokens(0)
  assert docs.num_words(1) == 2 and docs.num_bytes(1) == 6
  assert docs.tokens(1).tolist() == list("ü ★".encode())
  docs.tokens(1)
  assert loads.count(1) == 2  # Counting, then tokenizing; then cached.
  # Doc 0 (15 tokens) is over the 8-token cache: loaded each time.
  docs.tokens(0)
  assert loads.count(0) == 3
  with pytest.raises(ValueError, match=r"'c' \(index 2 of test/docs\)"):
    docs.num_tokens(2)
  with pytest.raises(IndexError):
    docs.tokens(3)
