"""PG-19 through TFDS: the real builder on a generated tiny raw layout, and
`tfds.testing.mock_data` for the data-source path without any files."""

import pathlib

import numpy as np
import pytest

from compressive import data
from helpers import data_of, to_evaluate

tfds = pytest.importorskip("tensorflow_datasets")

BOOKS = {  # split -> {book_id: text}
  "train": {
    101: "Call me Ishmael.\nSome years ago",
    102: "It was the best",
    103: "In a hole in the ground",
    104: "Happy families",
  },
  "validation": {201: "  The validation book,\nwith  two lines.\n\n", 202: "Another one"},
  "test": {301: "The test book", 302: "Último libro ★"},
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """A tiny PG-19 laid out like gs://deepmind-gutenberg, prepared once."""
  root = tmp_path_factory.mktemp("pg19")
  raw = root / "raw"
  rows = ["_id,short_book_title,publication_date,url"]  # A header is skipped.
  for split, books in BOOKS.items():
    (raw / split).mkdir(parents=True)
    for book_id, text in books.items():
      (raw / split / f"{book_id}.txt").write_text(text, encoding="utf-8")
      rows.append(
        f'{book_id},"Title {book_id}, a novel",1900,http://www.gutenberg.org/ebooks/{book_id}'
      )
  (raw / "metadata.csv").write_text("\n".join(rows) + "\n")
  config = data.default_data_config()
  config.source = "pg19"
  config.pg19.data_dir = str(root / "tfds")
  config.pg19.raw_dir = str(raw)
  return config


def test_real_builder_prepares_local_raw_files(prepared):
  tok = data.ByteTokenizer()
  for split, books in BOOKS.items():
    docs = data.get_documents(data_of(prepared), split, tok)
    assert len(docs) == len(books)
    got = {}
    for i in range(len(docs)):
      book_id, title = docs.name(i).split(" ", 1)
      assert title == f"Title {book_id}, a novel"  # Quoted comma kept.
      got[int(book_id)] = docs.text(i)
      original = books[int(book_id)].strip()  # The builder strips texts.
      assert docs.text(i) == original
      assert docs.num_words(i) == len(original.split())
      assert docs.num_bytes(i) == len(original.encode("utf-8"))
      np.testing.assert_array_equal(docs.tokens(i), tok.encode(original))
    assert set(got) == set(books)
  # Prepared in array_record under data_dir; a second call reuses it and
  # gives the same (fixed) record order.
  variant = pathlib.Path(prepared.pg19.data_dir) / "pg19" / "0.1.1"
  assert list(variant.glob("pg19-train.array_record*"))
  a = data.get_documents(data_of(prepared), "train", tok)
  b = data.get_documents(data_of(prepared), "train", tok)
  assert [a.name(i) for i in range(len(a))] == [b.name(i) for i in range(len(b))]


def test_evaluation_pass_over_pg19(prepared):
  docs = data.get_documents(data_of(prepared), "validation", data.ByteTokenizer())
  it = data.SegmentIterator(docs, batch_size=2, segment_length=8, repeat=False)
  batches = list(it)
  predicted = sum(int(b["mask"].sum()) for b in batches)
  assert predicted == sum(docs.num_tokens(i) - 1 for i in range(len(docs)))


def test_mock_data_source():
  config = data.default_data_config()
  config.source = "pg19"
  config.pg19.data_dir = "/nonexistent/never/read"
  with tfds.testing.mock_data(num_examples=5):
    docs = data.get_documents(data_of(config), "test", data.ByteTokenizer())
    assert len(docs) == 5
    for i in range(5):
      assert docs.num_bytes(i) == len(docs.text(i).encode("utf-8"))
    it = data.SegmentIterator(docs, batch_size=5, segment_length=4, seed=0)
    batch = next(it)
    assert batch["start_of_sequence"].all()


def test_pg19_config_errors(tmp_path):
  config = data.default_data_config()
  config.source = "pg19"
  with pytest.raises(ValueError, match="data.pg19.data_dir"):
    data.get_documents(data_of(config), "train", data.ByteTokenizer())
  config.pg19.data_dir = str(tmp_path / "tfds")
  config.pg19.raw_dir = str(tmp_path / "absent")
  with pytest.raises(FileNotFoundError, match="absent"):
    data.get_documents(data_of(config), "train", data.ByteTokenizer())
  (tmp_path / "raw").mkdir()
  config.pg19.raw_dir = str(tmp_path / "raw")
  with pytest.raises(FileNotFoundError, match="metadata.csv"):
    data.get_documents(data_of(config), "train", data.ByteTokenizer())


# -- Word-level perplexity of an evaluation pass (compressive/evaluation/evaluate.py). ----

OFFICIAL = {"validation": 3_007_061, "test": 6_966_499}  # Rae et al. 2020, Table 2


def evaluate_pg19(prepared, split, eval_split=None, **kwargs):
  """eval_lib.evaluate of a tiny untrained byte-level model over `split` of
  the tiny PG-19. config.eval.split is `split`, or with `eval_split` that,
  and `split` is passed to evaluate (as eval.py does)."""
  from flax import nnx

  import compressive
  from compressive.configs import default
  from compressive.evaluation import evaluate as eval_lib

  config = default.get_config()
  config.data = prepared.copy_and_resolve_references()
  m = config.model
  m.num_layers, m.num_heads, m.d_model, m.d_ff = 1, 2, 16, 32
  m.segment_length, m.memory_length, m.compressed_memory_length = 8, 8, 4
  config.batch_size = 2
  config.eval.split = eval_split or split
  if eval_split:
    kwargs["split"] = split
  model = compressive.CompressiveTransformer(
    compressive.ModelConfig.from_config(m), rngs=nnx.Rngs(0)
  )
  docs = data.get_documents(data_of(config.data), split, data.get_tokenizer(config.data))
  return eval_lib.evaluate(model, docs, to_evaluate(config), **kwargs), docs


def counted_words(docs):
  return sum(len(docs.text(i).split()) for i in range(len(docs)))


def word_warnings(caplog):
  return [
    r
    for r in caplog.records
    if r.name == "compressive" and r.levelname == "WARNING" and "official" in r.message
  ]


@pytest.mark.parametrize("split,eval_split", [("validation", None), ("test", "train")])
def test_word_perplexity_of_an_official_split_uses_the_official_total(
  prepared, split, eval_split, caplog
):
  import json
  import math

  caplog.set_level("WARNING", logger="compressive")
  result, docs = evaluate_pg19(prepared, split, eval_split)
  words = counted_words(docs)
  assert 0 < words < 20  # The tiny books, far from the official totals.
  assert result["words"] == words
  assert result["words_official"] == OFFICIAL[split]
  nats = result["loss"] * result["tokens"]
  assert result["word_perplexity"] == pytest.approx(math.exp(nats / OFFICIAL[split]), rel=1e-6)
  # As eval.py writes it: the word counts stay integers in the JSON.
  assert json.loads(json.dumps(result))["words_official"] == OFFICIAL[split]
  assert isinstance(result["words"], int) and isinstance(result["words_official"], int)
  # One warning line that names both numbers.
  (warning,) = word_warnings(caplog)
  assert str(words) in warning.message and str(OFFICIAL[split]) in warning.message
  assert "\n" not in warning.message


def test_word_perplexity_of_the_train_split_uses_the_counted_words(prepared, caplog):
  import math

  caplog.set_level("WARNING", logger="compressive")
  result, docs = evaluate_pg19(prepared, "train")
  words = counted_words(docs)
  assert result["words"] == words and "words_official" not in result
  assert result["word_perplexity"] == pytest.approx(
    math.exp(result["loss"] * result["tokens"] / words), rel=1e-6
  )
  assert not word_warnings(caplog)


def test_word_perplexity_only_after_a_complete_pass(prepared, caplog):
  caplog.set_level("WARNING", logger="compressive")
  cut, docs = evaluate_pg19(prepared, "validation", max_segments=2)
  predicted = sum(docs.num_tokens(i) - 1 for i in range(len(docs)))
  assert cut["tokens"] < predicted
  for key in ("word_perplexity", "words", "words_official"):
    assert key not in cut
  assert not word_warnings(caplog)
  # A max_segments the split ends before is a complete pass.
  whole, _ = evaluate_pg19(prepared, "validation", max_segments=1000)
  assert whole["tokens"] == predicted and whole["words_official"] == OFFICIAL["validation"]
