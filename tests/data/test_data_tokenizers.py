"""Tokenizers: bytes, SentencePiece training (offline, tiny) and the script."""

import os
import textwrap

import ml_collections
import numpy as np
import pytest

from compressive import data
from helpers import data_of, generated_texts
import inprocess


def test_byte_tokenizer_round_trip():
  tok = data.ByteTokenizer()
  text = "Ünïcode ★ and\nnewlines 😀"
  ids = tok.encode(text)
  assert ids.dtype == np.int32 and tok.vocab_size == 256
  assert len(ids) == len(text.encode("utf-8"))
  assert tok.decode(ids) == text
  assert tok.decode(ids[:-1]).endswith("\ufffd")  # A cut character shows.


def test_train_sentencepiece_round_trip(tmp_path):
  path = str(tmp_path / "spm" / "tiny.model")
  tok = data.train_sentencepiece(generated_texts(30), vocab_size=320, model_path=path)
  assert os.path.exists(path)
  assert 256 < tok.vocab_size <= 320
  # Unseen words, characters outside the training text, odd whitespace.
  text = "  The king\n\nrode  to Zürich ★ 😀\n\tat night \n"
  ids = tok.encode(text)
  assert ids.dtype == np.int32 and ids.min() > 0  # 0 is padding only.
  assert ids.max() < tok.vocab_size
  assert tok.decode(ids) == text
  # Learned subwords make known text shorter than its bytes.
  known = generated_texts(1, seed=9)[0]
  assert len(tok.encode(known)) < 0.6 * len(known.encode("utf-8"))
  # Reloading through the config gives the same model.
  config = data.default_data_config()
  config.tokenizer = "sentencepiece"
  config.spm_model = path
  again = data.get_tokenizer(data_of(config))
  np.testing.assert_array_equal(again.encode(text), ids)


def test_tokenizer_config_errors(tmp_path):
  config = data.default_data_config()
  config.tokenizer = "sentencepiece"
  with pytest.raises(ValueError, match="spm_model"):
    data.get_tokenizer(data_of(config))
  config.spm_model = str(tmp_path / "missing.model")
  with pytest.raises(FileNotFoundError, match="missing.model"):
    data.get_tokenizer(data_of(config))
  config.tokenizer = "words"
  with pytest.raises(ValueError, match="words"):
    data.get_tokenizer(data_of(config))


@pytest.mark.slow
def test_train_tokenizer_script(tmp_path):
  corpus = tmp_path / "corpus"
  for split in data.SPLITS:
    (corpus / split).mkdir(parents=True)
  for i, text in enumerate(generated_texts(12)):
    split = "train" if i < 10 else ("validation" if i == 10 else "test")
    (corpus / split / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
  model = tmp_path / "out" / "spm.model"
  config_file = tmp_path / "tiny_config.py"
  config_file.write_text(
    textwrap.dedent(f"""
      import ml_collections
      from compressive.data import config as data_config

      def get_config():
        c = ml_collections.ConfigDict()
        c.data = data_config.default_data_config()
        c.data.source = 'text_files'
        c.data.text_files.path = {str(corpus)!r}
        c.data.tokenizer = 'sentencepiece'
        c.data.spm_model = {str(model)!r}
        c.data.spm_vocab_size = 300
        return c
      """)
  )
  result = inprocess.run("train_tokenizer.py", [f"--config={config_file}"], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  assert model.exists()

  # The trained model feeds the pipeline end to end.
  namespace = {}
  exec(config_file.read_text(), namespace)
  config = namespace["get_config"]().data
  tok = data.get_tokenizer(data_of(config))
  docs = data.get_documents(data_of(config), "validation", tok)
  assert len(docs) == 1
  assert tok.decode(docs.tokens(0)) == docs.text(0)
  batch = next(data.SegmentIterator(docs, batch_size=1, segment_length=16, repeat=False))
  assert batch["mask"].any()


def test_iter_texts_respects_budget(tmp_path):
  for i, text in enumerate(generated_texts(9)):
    (tmp_path / f"d{i}.txt").write_text(text, encoding="utf-8")
  config = data.default_data_config()
  config.source = "text_files"
  config.text_files.path = str(tmp_path)
  everything = list(data.iter_texts(data_of(config), "train"))
  assert len(everything) == 7  # 9 files, one each held out.
  budget = len(everything[0].encode()) + 1
  some = list(data.iter_texts(data_of(config), "train", max_bytes=budget))
  assert len(some) == 2  # The one crossing the budget is included.
  assert isinstance(config, ml_collections.ConfigDict)
