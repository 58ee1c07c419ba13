"""Your own tokenizer and the model agree: train_tokenizer says how many
pieces it wrote and the model.vocab_size to train with; a run whose
model.vocab_size exceeds its tokenizer's pieces is warned at its start; the
sampler never emits an id its tokenizer cannot decode, and an id past the
pieces is one line. DATA.md's SentencePiece recipe (tokenizer, train,
sample) runs as written, at a tiny size."""

import logging
import os
import re
import shlex

import pytest

from compressive import config as config_lib
from compressive import data as data_lib
from compressive.errors import DataError
from compressive.model.sampling import Sampler
from compressive.reading import PiecesSampler
from helpers import ROOT, generated_texts, make_model, tiny_experiment, tiny_model_config
import inprocess


def test_an_id_past_the_pieces_is_one_line(tmp_path):
  model = tmp_path / "m.model"
  tokenizer = data_lib.train_sentencepiece(generated_texts(20), 4096, str(model))
  pieces = tokenizer.vocab_size
  assert pieces < 4096  # a small corpus has fewer than asked for
  assert tokenizer.decode(tokenizer.encode("the king")) == "the king"
  with pytest.raises(DataError) as e:
    tokenizer.decode([5, pieces + 7])
  assert str(e.value) == (
    f"token id {pieces + 7} is not a piece of {str(model)!r} (data.spm_model: {pieces} "
    f"pieces, ids 0-{pieces - 1}); a model whose model.vocab_size is larger than its "
    "tokenizer's pieces emitted it"
  )


def test_the_sampler_never_emits_an_id_past_the_tokenizer_pieces():
  # An untrained model over 32 ids, its tokenizer's 5 pieces: the plain
  # Sampler picks ids past them, the tool's never does, sampled or greedy.
  cfg = tiny_model_config(vocab_size=32)
  model = make_model(cfg, seed=1)
  prompt = [1, 2, 3]
  plain = {int(t[0]) for t in Sampler(model).generate(prompt, 40, temperature=3.0, seed=2)}
  assert max(plain) >= 5  # the test can fail
  for kwargs in (
    {"temperature": 3.0},
    {"temperature": 0.0},
    {"temperature": 2.0, "top_k": 20},
    {"temperature": 2.0, "top_p": 0.99},
  ):
    held = PiecesSampler(model, pieces=5)
    ids = [int(t[0]) for t in held.generate(prompt, 40, seed=2, **kwargs)]
    assert len(ids) == 40 and max(ids) < 5, (kwargs, ids)
  # Where the pieces are the whole vocabulary, it is the Sampler.
  same = PiecesSampler(model, pieces=32)
  assert [int(t[0]) for t in same.generate(prompt, 20, temperature=1.0, seed=3)] == [
    int(t[0]) for t in Sampler(model).generate(prompt, 20, temperature=1.0, seed=3)
  ]


def test_a_vocabulary_larger_than_the_pieces_is_warned_at_the_start(tmp_path, caplog):
  texts = tmp_path / "texts"
  texts.mkdir()
  for i, text in enumerate(generated_texts(6)):
    (texts / f"book{i}.txt").write_text(text)
  model = tmp_path / "m.model"
  pieces = data_lib.train_sentencepiece(generated_texts(20), 4096, str(model)).vocab_size
  fields = {
    "data.source": "text_files",
    "data.text_files.path": str(texts),
    "data.tokenizer": "sentencepiece",
    "data.spm_model": str(model),
    "model.vocab_size": 4096,
  }
  with caplog.at_level(logging.WARNING, logger="compressive"):
    config_lib.check(tiny_experiment(**fields))
  [warning] = [r.getMessage() for r in caplog.records]
  assert warning == (
    f"model.vocab_size=4096 is larger than the tokenizer's {pieces} pieces "
    f"(data.spm_model={model}): ids {pieces}-4095 never occur in the data and are never "
    f"sampled; --config.model.vocab_size={pieces} trains the vocabulary there is"
  )
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="compressive"):
    config_lib.check(tiny_experiment(**dict(fields, **{"model.vocab_size": pieces})))
    config_lib.check(tiny_experiment(**fields), training=False)  # a reader: no warning
  assert not caplog.records


# -- DATA.md's recipe, as written. ------------------------------------------------

# The recipe's commands at a size that trains in seconds: appended to its
# train command (the last value of a field wins).
TINY = [
  "--config.num_train_steps=2",
  "--config.batch_size=4",
  "--config.segments_per_step=1",
  "--config.model.num_layers=1",
  "--config.model.d_model=32",
  "--config.model.d_ff=64",
  "--config.model.num_heads=2",
  "--config.model.segment_length=16",
  "--config.model.memory_length=16",
  "--config.model.compressed_memory_length=8",
  "--config.log_every_steps=1",
  "--config.eval_every_steps=0",
  "--config.checkpoint_every_steps=2",
  "--config.eval.max_segments=2",
]


def recipe() -> list[list[str]]:
  """The commands of DATA.md's SentencePiece block (the one that trains a
  tokenizer), each as its words, continuation lines joined."""
  with open(os.path.join(ROOT, "docs", "DATA.md"), encoding="utf-8") as f:
    blocks = re.findall(r"```sh\n(.*?)```", f.read(), re.S)
  [block] = [b for b in blocks if "train_tokenizer.py" in b and "input.txt" in b]
  return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.slow
def test_the_data_md_tokenizer_recipe_trains_and_samples(tmp_path):
  commands = recipe()
  assert [c[1] for c in commands] == ["train_tokenizer.py", "train.py", "sample.py"]
  # input.txt: about 80 KB of text, in which a 4096-piece vocabulary has
  # far fewer pieces (the review's case: it wrote 2,782).
  (tmp_path / "input.txt").write_text("\n\n".join(generated_texts(60)))
  outputs = []
  for words in commands:
    assert words[0] == ".venv/bin/python"
    args = words[2:] + (TINY if words[1] == "train.py" else [])
    r = inprocess.run(words[1], args, cwd=str(tmp_path))
    assert r.returncode == 0, (words[1], r.stderr[-3000:])
    outputs.append(r)
  wrote = outputs[0].stdout.strip().splitlines()[-1]
  pieces = int(re.search(r": (\d+) pieces", wrote).group(1))
  assert pieces < 4096 and wrote.endswith(f"--config.model.vocab_size={pieces}"), wrote
  assert "I0" not in outputs[0].stderr  # no absl prefix
  assert (
    f"model.vocab_size=4096 is larger than the tokenizer's {pieces} pieces" in outputs[1].stderr
  )
  # The sample: the prompt and 200 tokens' text, every one a piece.
  text = outputs[2].stdout
  prompt = [w for w in commands[2] if w.startswith("--prompt=")][0][len("--prompt=") :]
  assert text.startswith(prompt) and len(text) > len(prompt) + 50, text
  assert outputs[2].stderr.count("\n") <= 2, outputs[2].stderr  # no traceback


def test_train_tokenizer_prints_its_pieces_and_the_vocab_size_to_train_with(tmp_path):
  (tmp_path / "input.txt").write_text("\n\n".join(generated_texts(60)))
  r = inprocess.run(
    "train_tokenizer.py",
    [
      "--config=default",
      "--config.data.source=text_files",
      "--config.data.text_files.path=input.txt",
      "--config.data.spm_model=m.model",
      "--config.data.spm_vocab_size=4096",
    ],
    cwd=str(tmp_path),
  )
  assert r.returncode == 0, r.stderr[-3000:]
  pieces = data_lib.SentencePieceTokenizer(str(tmp_path / "m.model")).vocab_size
  assert r.stdout.strip().splitlines()[-1] == (
    f"wrote m.model: {pieces} pieces (fewer than data.spm_vocab_size=4096: the corpus has no "
    f"more); train with --config.data.tokenizer=sentencepiece --config.data.spm_model=m.model "
    f"--config.model.vocab_size={pieces}"
  )
  # Its log lines carry the tools' short prefix, not absl's.
  assert not re.search(r"^[IWE]\d{4} ", r.stderr, re.M), r.stderr
