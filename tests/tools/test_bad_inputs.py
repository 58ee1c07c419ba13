"""A table of bad inputs: each gets one clear line naming its cause and exit
code 2 (1 for a non-finite loss), raised before any expensive work.

Each case runs the same checks the entry points run, inside the same
`cli.user_errors()` that turns exceptions into exits; a few cases also go
through train.py as a user would (test_cli.py, test_robustness.py).
"""

from contextlib import redirect_stderr
import io
import os
import zipfile

import pytest

import compressive
from compressive import cli
from compressive import config as config_lib
from compressive import data as data_lib
from compressive.training import loop as train_lib
from compressive.training import runconfig
from helpers import checked, data_of, tiny_experiment, to_train


def set_fields(**fields):
  return lambda tmp: tiny_experiment(**fields)


def validate(make_config):
  def run(tmp):
    config_lib.check(make_config(tmp))

  return run


def read_split(make_config, split="train"):
  """Validates the data config, then reads every document of `split` (all
  splits when None: a file lands in one split by the hash of its name)."""

  def run(tmp):
    config = make_config(tmp)
    data_lib.validate_data_config(data_of(config.data))
    tokenizer = data_lib.get_tokenizer(data_of(config.data))
    for s in (split,) if split else ("train", "validation", "test"):
      docs = data_lib.get_documents(data_of(config.data), s, tokenizer)
      for i in range(len(docs)):
        docs.tokens(i)

  return run


def text_dir(files):
  def make(tmp):
    folder = tmp / "texts"
    folder.mkdir(exist_ok=True)
    for name, content in files.items():
      (folder / name).write_bytes(content)
    return tiny_experiment(**{"data.source": "text_files", "data.text_files.path": str(folder)})

  return make


def enwik8_file(size, name="enwik8", zipped=False):
  def make(tmp):
    path = tmp / name
    if zipped:
      with zipfile.ZipFile(path, "w") as z:
        z.writestr("enwik8", b"x" * size)
    else:
      path.write_bytes(b"x" * size)
    return tiny_experiment(**{"data.source": "enwik8", "data.enwik8.path": str(path)})

  return make


def resume_with(**fields):
  def run(tmp):
    train_lib.train_and_evaluate(
      to_train(tiny_experiment(**{"num_train_steps": 1})), str(tmp / "wd")
    )
    train_lib.train_and_evaluate(
      to_train(tiny_experiment(**{"num_train_steps": 2, **fields})), str(tmp / "wd")
    )

  return run


def load_step(step):
  def run(tmp):
    train_lib.train_and_evaluate(
      to_train(tiny_experiment(**{"num_train_steps": 1})), str(tmp / "wd")
    )
    compressive.load(str(tmp / "wd"), step)

  return run


def second_trainer(tmp):
  from compressive.training.lock import WorkdirLock

  os.makedirs(tmp / "wd")
  with WorkdirLock(str(tmp / "wd")):  # as a running train.py holds it
    train_lib.train_and_evaluate(to_train(tiny_experiment()), str(tmp / "wd"))


def _one_step(tmp):
  experiment = tiny_experiment(**{"num_train_steps": 1, "eval_every_steps": 0})
  train_lib.train_and_evaluate(to_train(experiment), str(tmp / "wd"))


def _flip(tmp, step=1):
  state = tmp / "wd" / "checkpoints" / str(step) / "state"
  files = [
    os.path.join(r, n)
    for r, _, ns in os.walk(state)
    for n in ns
    if os.sep + "d" + os.sep in os.path.join(r, n)
  ]
  path = max(files, key=os.path.getsize)
  data = bytearray(open(path, "rb").read())
  middle = slice(len(data) // 2, len(data) // 2 + 8)
  data[middle] = bytes(b ^ 0x5A for b in data[middle])
  open(path, "wb").write(data)


def damaged_newest(tmp):
  _one_step(tmp)
  _flip(tmp)
  compressive.load(str(tmp / "wd"))


def stale_config(tmp):
  _one_step(tmp)
  narrow = tiny_experiment(**{"model.d_model": 16, "num_train_steps": 2})
  runconfig.save_config(str(tmp / "wd"), checked(narrow))
  train_lib.train_and_evaluate(to_train(narrow), str(tmp / "wd"), restore_intact=True)


def nothing_intact(tmp):
  _one_step(tmp)
  _flip(tmp)
  train_lib.train_and_evaluate(
    to_train(tiny_experiment(**{"num_train_steps": 2})), str(tmp / "wd"), restore_intact=True
  )


def damaged_config(tmp):
  _one_step(tmp)
  (tmp / "wd" / "config.json").write_text('{"model": {"d_model": 3')
  compressive.load(str(tmp / "wd"))


CASES = [
  # Model fields.
  (
    "segment not a multiple of rate",
    validate(set_fields(**{"model.compression_rate": 3})),
    "model.segment_length=8",
  ),
  (
    "width not divisible by heads",
    validate(set_fields(**{"model.num_heads": 3})),
    "model.d_model=32",
  ),
  (
    "negative memory",
    validate(set_fields(**{"model.memory_length": -1})),
    "model.memory_length=-1",
  ),
  (
    "compressed memory without memory",
    validate(set_fields(**{"model.memory_length": 0})),
    "model.compressed_memory_length=4",
  ),
  (
    "unknown compression",
    validate(set_fields(**{"model.compression": "avg"})),
    "model.compression='avg'",
  ),
  (
    "unknown loss",
    validate(set_fields(**{"model.reconstruction_loss": "l1"})),
    "model.reconstruction_loss='l1'",
  ),
  ("dropout of one", validate(set_fields(**{"model.dropout_rate": 1.0})), "model.dropout_rate=1.0"),
  ("unknown dtype", validate(set_fields(**{"model.dtype": "float16"})), "model.dtype='float16'"),
  ("no layers", validate(set_fields(**{"model.num_layers": 0})), "model.num_layers=0"),
  (
    "vocabulary below bytes",
    validate(set_fields(**{"model.vocab_size": 100})),
    "model.vocab_size=100",
  ),
  # Training fields.
  ("zero batch", validate(set_fields(batch_size=0)), "batch_size=0"),
  ("zero steps", validate(set_fields(num_train_steps=0)), "num_train_steps=0"),
  ("zero segments per step", validate(set_fields(segments_per_step=0)), "segments_per_step=0"),
  ("unknown optimizer", validate(set_fields(**{"optimizer.name": "sgd"})), "optimizer.name='sgd'"),
  (
    "zero learning rate",
    validate(set_fields(**{"optimizer.learning_rate": 0.0})),
    "optimizer.learning_rate=0.0",
  ),
  (
    "infinite learning rate",
    validate(set_fields(**{"optimizer.learning_rate": float("inf")})),
    "optimizer.learning_rate=inf",
  ),
  (
    "NaN learning rate",
    validate(set_fields(**{"optimizer.learning_rate": float("nan")})),
    "optimizer.learning_rate=nan",
  ),
  (
    "negative final learning-rate fraction",
    validate(set_fields(**{"optimizer.final_lr_fraction": -5.0})),
    "optimizer.final_lr_fraction=-5.0",
  ),
  (
    "final learning-rate fraction above one",
    validate(set_fields(**{"optimizer.final_lr_fraction": 2.0})),
    "optimizer.final_lr_fraction=2.0",
  ),
  (
    "negative clip norm",
    validate(set_fields(**{"optimizer.grad_clip_norm": -1.0})),
    "optimizer.grad_clip_norm=-1.0",
  ),
  (
    "zero clip norm",
    validate(set_fields(**{"optimizer.grad_clip_norm": 0.0})),
    "optimizer.grad_clip_norm=0.0",
  ),
  ("b1 of one", validate(set_fields(**{"optimizer.b1": 1.0})), "optimizer.b1=1.0"),
  ("negative b2", validate(set_fields(**{"optimizer.b2": -0.1})), "optimizer.b2=-0.1"),
  ("zero eps", validate(set_fields(**{"optimizer.eps": 0.0})), "optimizer.eps=0.0"),
  (
    "negative weight decay",
    validate(set_fields(**{"optimizer.weight_decay": -0.01})),
    "optimizer.weight_decay=-0.01",
  ),
  (
    "negative warmup",
    validate(set_fields(**{"optimizer.warmup_steps": -1})),
    "optimizer.warmup_steps=-1",
  ),
  ("keep no checkpoints", validate(set_fields(keep_checkpoints=0)), "keep_checkpoints=0"),
  (
    "keep a negative number of checkpoints",
    validate(set_fields(keep_checkpoints=-1)),
    "keep_checkpoints=-1",
  ),
  ("log every zero steps", validate(set_fields(log_every_steps=0)), "log_every_steps=0"),
  ("negative eval interval", validate(set_fields(eval_every_steps=-1)), "eval_every_steps=-1"),
  (
    "negative checkpoint interval",
    validate(set_fields(checkpoint_every_steps=-2)),
    "checkpoint_every_steps=-2",
  ),
  ("b2 of one", validate(set_fields(**{"optimizer.b2": 1.0})), "optimizer.b2=1.0"),
  # Evaluation fields.
  (
    "eval compressed memory without memory",
    validate(set_fields(**{"eval.memory_length": 0, "eval.compressed_memory_length": 8})),
    "eval.compressed_memory_length=8",
  ),
  (
    "eval segment not a multiple of rate",
    validate(set_fields(**{"eval.segment_length": 9})),
    "eval.segment_length=9",
  ),
  (
    "eval memory below -1",
    validate(set_fields(**{"eval.memory_length": -5})),
    "eval.memory_length=-5",
  ),
  (
    "eval compressed memory below -1",
    validate(set_fields(**{"eval.compressed_memory_length": -2})),
    "eval.compressed_memory_length=-2",
  ),
  (
    "eval segment below -1",
    validate(set_fields(**{"eval.segment_length": -3})),
    "eval.segment_length=-3",
  ),
  ("unknown eval split", validate(set_fields(**{"eval.split": "dev"})), "eval.split='dev'"),
  # Mesh.
  (
    "mesh larger than the devices",
    validate(set_fields(**{"mesh.shape": (3, 1, 1)})),
    "mesh.shape=(3, 1, 1) needs 3 devices",
  ),
  # Data.
  ("unknown source", read_split(set_fields(**{"data.source": "wiki"})), "data.source='wiki'"),
  (
    "unknown tokenizer",
    read_split(set_fields(**{"data.tokenizer": "chars"})),
    "data.tokenizer='chars'",
  ),
  (
    "enwik8 without a path",
    read_split(set_fields(**{"data.source": "enwik8"})),
    "data.enwik8.path is empty",
  ),
  (
    "enwik8 path missing",
    read_split(set_fields(**{"data.source": "enwik8", "data.enwik8.path": "/nonexistent/enwik8"})),
    "data.enwik8.path='/nonexistent/enwik8' does not exist",
  ),
  (
    "enwik8 of the wrong size",
    read_split(enwik8_file(1000)),
    "the enwik8 file has 1000 bytes but data.enwik8.split_bytes",
  ),
  (
    "enwik8 zip of the wrong size",
    read_split(enwik8_file(1000, "enwik8.zip", zipped=True)),
    "the enwik8 file has 1000 bytes but data.enwik8.split_bytes",
  ),
  (
    "text folder missing",
    read_split(
      set_fields(**{"data.source": "text_files", "data.text_files.path": "/nonexistent/texts"})
    ),
    "data.text_files.path='/nonexistent/texts' is neither a folder of .txt files nor a text file",
  ),
  (
    "empty text folder",
    read_split(text_dir({})),
    "/texts (and no train/validation/test subfolders)",
  ),
  (
    "invalid UTF-8",
    read_split(
      text_dir(
        {f"book{i}.txt": b"fine text " * 20 for i in range(40)} | {"bad.txt": b"ok \xff\xfe bad"}
      ),
      split=None,
    ),
    "/texts/bad.txt: invalid UTF-8 at byte 3",
  ),
  (
    "one-byte document",
    read_split(
      text_dir({f"book{i}.txt": b"fine text " * 20 for i in range(40)} | {"tiny.txt": b"x"}),
      split=None,
    ),
    "tiny.txt",
  ),
  (
    "SentencePiece model missing",
    read_split(
      set_fields(**{"data.tokenizer": "sentencepiece", "data.spm_model": "/nonexistent.model"})
    ),
    "data.spm_model='/nonexistent.model' does not exist",
  ),
  (
    "pg19 without data_dir",
    read_split(
      set_fields(
        **{"data.source": "pg19", "data.tokenizer": "sentencepiece", "data.spm_model": __file__}
      )
    ),
    "data.pg19.data_dir is empty",
  ),
  (
    "recall with subwords",
    read_split(
      set_fields(
        **{"data.source": "recall", "data.tokenizer": "sentencepiece", "data.spm_model": __file__}
      )
    ),
    "data.source='recall' is byte text",
  ),
  # Checkpoints.
  ("resume with another width", resume_with(**{"model.d_model": 16}), "model.d_model 32 -> 16"),
  ("resume with another batch", resume_with(batch_size=2), "batch_size 4 -> 2"),
  ("no checkpoint to load", lambda tmp: compressive.load(str(tmp)), "config.json not found"),
  ("checkpoint step that does not exist", load_step(7), "no checkpoint of step 7"),
  ("a second trainer on the workdir", second_trainer, "in use by another trainer (pid"),
  ("flipped bytes in the newest checkpoint", damaged_newest, "checkpoints/1 is damaged"),
  ("stale config.json over another model's checkpoints", stale_config, "parameter shapes differ"),
  ("restore_intact with nothing intact", nothing_intact, "no checkpoint in"),
  ("damaged config.json", damaged_config, "config.json is damaged"),
]


@pytest.mark.parametrize("name,run,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, run, expected, tmp_path):
  err = io.StringIO()
  with redirect_stderr(err), pytest.raises(SystemExit) as info:
    with cli.user_errors():
      run(tmp_path)
      raise AssertionError(f"{name}: accepted")
  lines = err.getvalue().strip().splitlines()
  assert info.value.code == 2, lines
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  assert expected in lines[0], lines[0]


def test_each_case_is_named_once_and_expects_a_line_of_its_own():
  # A case copied without a new name would run under an id pytest made up,
  # and an empty or blank expectation is in every line: either passes unseen.
  names = [name for name, _, _ in CASES]
  assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
  assert all(len(expected.strip()) >= 8 for _, _, expected in CASES), [
    name for name, _, expected in CASES if len(expected.strip()) < 8
  ]


@pytest.mark.parametrize(
  "run",
  [
    lambda url: train_lib.train_and_evaluate(to_train(tiny_experiment()), url),
    lambda url: compressive.load(url),
  ],
  ids=["train_and_evaluate", "load"],
)
def test_a_url_for_a_workdir_is_one_line_and_makes_no_local_folder(run, tmp_path, monkeypatch):
  # os.path reads gs://b/run as the relative folder gs:/b/run: a run that
  # went on would write its checkpoints there, in the current folder.
  monkeypatch.chdir(tmp_path)
  err = io.StringIO()
  with redirect_stderr(err), pytest.raises(SystemExit) as info:
    with cli.user_errors():
      run("s3://bucket/run")
  assert info.value.code == 2
  assert (
    "on s3:// is not supported; give a path on this machine's file system or a gs:// URL"
    in err.getvalue()
  )
  assert os.listdir(tmp_path) == []
