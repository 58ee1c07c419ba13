"""Closed plugin contracts: a compression or data source defined outside the
package is named `module:Name` and imported on demand; each compression
declares its own FLOPs; the resume check derives the model fields that fix
a checkpoint from the parameter tree; a source states its official word
totals."""

import inspect
import json
import math
import os
import re
import sys

import pytest

import compressive
from compressive import config as config_lib
from compressive import data
from compressive.data import registry
from compressive.errors import ConfigError
from compressive.model import compression as compression_lib
from compressive.model.config import ModelConfig
from compressive.scale import flops as flops_lib
from compressive.training import runconfig
from helpers import ROOT, checked, data_of, tiny_experiment, to_evaluate, to_train
import processes

PLUGIN = '''
from flax import nnx
import jax.numpy as jnp
import dataclasses
import numpy as np

from compressive.data import documents, registry
from compressive.model.compression import Compression
from compressive.model.layers import param


class LastSlot(Compression):
  """Keeps each group's newest slot times a learned gain (not registered)."""

  name = "plugin_last_slot"

  def __init__(self, rate, d_model, *, rngs, param_dtype=jnp.float32):
    super().__init__(rate, d_model, rngs=rngs, param_dtype=param_dtype)
    self.gain = param(nnx.initializers.ones, None, (d_model,), ("norm",), param_dtype)

  def __call__(self, slots, mask, usage):
    last = self.groups(slots)[:, :, -1]
    return last * self.gain[...].astype(slots.dtype), self.groups(mask).any(-1)


@dataclasses.dataclass(frozen=True)
class PluginWords:
  length: int = 60


def _get_documents(data_config, split, tokenizer):
  registry.check_split(split)
  n = data_config.plugin_words.length
  texts = [" ".join(["word"] * (n // 5 + i)) for i in range(3)]
  return documents.TextDocuments([f"{split}{i}" for i in range(3)], texts.__getitem__,
                                 tokenizer, description=f"plugin_words/{split}")


WORDS = registry.Source(name="plugin_words", schema=PluginWords,
                        get_documents=_get_documents,
                        official_words={"validation": 1000}.get)

NOT_A_COMPRESSION = int


def _declaring(flops):
  return type("Declares", (LastSlot,), {"flops_per_slot": classmethod(lambda cls, c, d: flops()),
                                       "__module__": __name__})


def _raise():
  raise KeyError("no such table")


FLOPS_TEXT = _declaring(lambda: "many")
FLOPS_NAN = _declaring(lambda: float("nan"))
FLOPS_NEGATIVE = _declaring(lambda: -1.0)
FLOPS_BOOL = _declaring(lambda: True)
FLOPS_RAISES = _declaring(_raise)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
  """A module `plugin_mod` that the test writes, on sys.path (and PYTHONPATH,
  for the entry points), imported afresh by each test."""
  (tmp_path / "plugin_mod.py").write_text(PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), ROOT]))
  sys.modules.pop("plugin_mod", None)
  yield "plugin_mod"
  sys.modules.pop("plugin_mod", None)


# -- FLOPs: each compression declares its own. ----------------------------------


def tiny_model(compression):
  return ModelConfig(
    vocab_size=256,
    num_layers=2,
    num_heads=2,
    d_model=16,
    d_ff=32,
    segment_length=8,
    memory_length=8,
    compressed_memory_length=4,
    compression_rate=4,
    compression=compression,
  )


def test_conv_flops_are_those_of_before():
  # flops.py's numbers for this config before compressions declared their own.
  got = flops_lib.flops_per_token(tiny_model("conv"), 3)
  assert (got.forward, got.train, got.evaluate) == (24405.333333333336, 71680.0, 20992.000000000004)
  pooled = flops_lib.flops_per_token(tiny_model("max_pool"), 3)
  assert (pooled.forward, pooled.train, pooled.evaluate) == (
    23381.333333333336,
    69632.0,
    19968.000000000004,
  )


def matmul_flops(jaxpr) -> int:
  """2 FLOPs per multiply-add of every dot_general in a jaxpr and the jaxprs
  it calls: the matmul count of compressive/scale/flops.py, read from the
  traced program instead of a formula. Any other contracting primitive
  (a convolution) fails the count: it would need counting too."""
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    assert name != "conv_general_dilated", f"{name} is not counted here"
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[i] for i in contract)
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          total += matmul_flops(inner)
  return total


# Every compression the package registers, from its registry (a new one is
# held to its declared FLOPs without being listed here).
BUILT_IN = sorted(
  name
  for name, cls in compression_lib.COMPRESSIONS.items()
  if cls.__module__ == compression_lib.__name__
)


@pytest.mark.parametrize("name", BUILT_IN)
@pytest.mark.parametrize("rate", [2, 3])
def test_each_compression_declares_the_matmul_flops_it_traces(name, rate):
  # flops_per_slot against the dot_generals of the compression's own traced
  # call on [B, N, d] evicted slots, per slot.
  from flax import nnx
  import jax
  import jax.numpy as jnp

  b, n, d = 2, 4 * rate, 8
  comp = compression_lib.COMPRESSIONS[name](rate, d, rngs=nnx.Rngs(0))
  slots, mask, usage = jnp.ones((b, n, d)), jnp.ones((b, n), bool), jnp.ones((b, n))
  traced = jax.make_jaxpr(lambda s, m, u: comp(s, m, u))(slots, mask, usage).jaxpr
  assert matmul_flops(traced) == b * n * compression_lib.COMPRESSIONS[name].flops_per_slot(rate, d)


def test_the_flops_counter_counts_a_known_product():
  import jax
  import jax.numpy as jnp

  f = lambda x, w: jax.jit(lambda a: jnp.tanh(a @ w))(x) @ w.T
  traced = jax.make_jaxpr(f)(jnp.ones((3, 5)), jnp.ones((5, 7))).jaxpr
  assert matmul_flops(traced) == 2 * 3 * 5 * 7 + 2 * 3 * 7 * 5


def test_dilated_conv_flops_reach_the_model_count():
  # The model-level count adds each layer's compression FLOPs per token.
  layers, c, d = 2, 4, 16
  per_slot = compression_lib.COMPRESSIONS["dilated_conv"].flops_per_slot(c, d)
  dilated = flops_lib.flops_per_token(tiny_model("dilated_conv"), 3)
  pooled = flops_lib.flops_per_token(tiny_model("max_pool"), 3)
  assert dilated.forward - pooled.forward == layers * per_slot
  assert dilated.train - pooled.train == 2 * layers * per_slot  # weight gradient only
  assert dilated.evaluate - pooled.evaluate == layers * per_slot


def test_parameter_free_compressions_do_no_matmul():
  for name in ("max_pool", "mean_pool", "most_used"):
    assert compression_lib.COMPRESSIONS[name].flops_per_slot(4, 16) == 0, name


def test_flops_names_no_compression():
  text = inspect.getsource(flops_lib)
  for name in compression_lib.COMPRESSIONS:
    assert not re.search(rf'["\']{name}["\']', text), name


# -- module:Name compressions. ----------------------------------------------------


def test_a_compression_is_imported_by_module_and_name(plugin):
  name = f"{plugin}:LastSlot"
  cls = compression_lib.resolve(name)
  assert cls.__name__ == "LastSlot" and cls.flops_per_slot(4, 16) == 0
  assert "plugin_last_slot" not in compression_lib.COMPRESSIONS  # nothing registered
  assert config_lib.check(tiny_experiment(**{"model.compression": name}), here=False)
  assert compression_lib.resolve("conv") is compression_lib.COMPRESSIONS["conv"]


@pytest.mark.parametrize(
  "name,message",
  [
    ("no_such_plugin_mod:X", r"cannot import module 'no_such_plugin_mod' \(ModuleNotFoundError"),
    ("plugin_mod:Missing", r"module 'plugin_mod' has no 'Missing'"),
    ("plugin_mod:", r"module 'plugin_mod' has no ''"),
    ("plugin_mod:NOT_A_COMPRESSION", r"'NOT_A_COMPRESSION' of 'plugin_mod' is not a subclass"),
    ("plugin_mod:WORDS", r"'WORDS' of 'plugin_mod' is not a subclass"),
  ],
)
def test_a_compression_that_cannot_be_had_is_one_line(plugin, name, message):
  with pytest.raises(
    ConfigError, match=rf"^model\.compression={re.escape(repr(name))}: {message}"
  ) as e:
    config_lib.check(tiny_experiment(**{"model.compression": name}), here=False)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize(
  "name,returned",
  [
    ("FLOPS_TEXT", "returned str 'many'"),
    ("FLOPS_NAN", "returned float nan"),
    ("FLOPS_NEGATIVE", "returned float -1.0"),
    ("FLOPS_BOOL", "returned bool True"),
    ("FLOPS_RAISES", "raised KeyError: 'no such table'"),
  ],
)
def test_a_compressions_declared_flops_are_held_to_the_contract(plugin, name, returned):
  # The experiment's check reads them at start-up, before the MFU would.
  with pytest.raises(
    ConfigError,
    match=re.escape(
      f"model.compression='{plugin}:{name}' ({plugin}.Declares): its flops_per_slot(2, 32) "
      f"{returned}"
    ),
  ) as e:
    config_lib.check(tiny_experiment(**{"model.compression": f"{plugin}:{name}"}), here=False)
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_an_outside_compression_trains_and_restores_by_its_string(plugin, tmp_path):
  name = f"{plugin}:LastSlot"
  workdir = str(tmp_path / "wd")
  r = processes.run(
    [
      sys.executable,
      "train.py",
      f"--workdir={workdir}",
      f"--config={os.path.join(ROOT, 'configs', 'default.py')}",
      "--config.data.source=synthetic",
      "--config.model.num_layers=1",
      "--config.model.d_model=16",
      "--config.model.d_ff=32",
      "--config.model.num_heads=2",
      "--config.model.segment_length=8",
      "--config.model.memory_length=8",
      "--config.model.compressed_memory_length=4",
      "--config.batch_size=2",
      "--config.segments_per_step=2",
      "--config.num_train_steps=2",
      "--config.checkpoint_every_steps=2",
      "--config.eval_every_steps=0",
      "--config.eval.max_segments=2",
      f"--config.model.compression={name}",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.load(open(os.path.join(workdir, "config.json")))["model"]["compression"] == name
  sys.modules.pop(plugin, None)
  # A saved config never imports code itself: the user names the module.
  with pytest.raises(ConfigError, match=rf"module '{plugin}' is not imported.*--plugin={plugin}"):
    compressive.load(workdir)
  assert plugin not in sys.modules
  _, model = compressive.load(workdir, plugins=[plugin])
  assert type(model.blocks[0].compressor.fn).__name__ == "LastSlot"
  assert plugin in sys.modules


# -- module:Name data sources, and the official word totals. -----------------------


def test_a_source_is_imported_by_module_and_name(plugin):
  c = data.default_data_config()
  c.source = f"{plugin}:WORDS"
  assert "plugin_words" not in c and "plugin_words" not in registry.names()
  typed = data_of(c)
  data.validate_data_config(typed)
  assert typed.plugin_words.length == 60  # its section, at its defaults
  docs = data.get_documents(typed, "validation", data.ByteTokenizer())
  assert len(docs) == 3 and docs.num_words(0) == 12
  assert registry.get(c.source).official_words("validation") == 1000
  assert registry.get("pg19").official_words("test") == 6_966_499
  assert registry.get("pg19").official_words("train") is None
  assert registry.get("enwik8").official_words is None


@pytest.mark.parametrize(
  "name,message",
  [
    ("no_such_plugin_mod:X", r"cannot import module 'no_such_plugin_mod'"),
    ("plugin_mod:Missing", r"module 'plugin_mod' has no 'Missing'"),
    (
      "plugin_mod:LastSlot",
      r"'LastSlot' of 'plugin_mod' is not a compressive\.data\.registry\.Source",
    ),
  ],
)
def test_a_source_that_cannot_be_had_is_one_line(plugin, name, message):
  c = data.default_data_config()
  c.source = name
  with pytest.raises(ConfigError, match=rf"^data\.source={re.escape(repr(name))}: {message}") as e:
    data.validate_data_config(data_of(c))
  assert "\n" not in str(e.value)


def test_word_perplexity_is_asked_of_the_source(plugin):
  import math

  from flax import nnx

  from compressive.evaluation import evaluate as eval_lib

  config = tiny_experiment(**{"data.source": f"{plugin}:WORDS"})
  data.validate_data_config(data_of(config.data))
  model = compressive.CompressiveTransformer(
    ModelConfig.from_config(config.model), rngs=nnx.Rngs(0)
  )
  docs = data.get_documents(data_of(config.data), "validation", data.ByteTokenizer())
  result = eval_lib.evaluate(model, docs, to_evaluate(config), split="validation")
  assert result["words"] == sum(docs.num_words(i) for i in range(3))
  assert result["words_official"] == 1000  # the source's, and a warning: far off
  assert result["word_perplexity"] == pytest.approx(
    math.exp(result["loss"] * result["tokens"] / 1000), rel=1e-6
  )
  train = eval_lib.evaluate(
    model,
    data.get_documents(data_of(config.data), "train", data.ByteTokenizer()),
    to_evaluate(config),
    split="train",
  )
  assert "words_official" not in train and train["word_perplexity"] > 1
  synthetic = tiny_experiment()
  docs = data.get_documents(data_of(synthetic.data), "validation", data.ByteTokenizer())
  assert "word_perplexity" not in eval_lib.evaluate(model, docs, to_evaluate(synthetic))


# -- The resume check. -------------------------------------------------------------


@pytest.mark.parametrize("field,other", [("scan_layers", {False: True}), ("norm", {"post": "pre"})])
def test_a_resume_that_changes_the_parameter_tree_is_refused(tmp_path, field, other):
  runconfig.save_config(str(tmp_path), checked(tiny_experiment()))
  saved = tiny_experiment().model[field]
  value = other[saved]
  with pytest.raises(
    ConfigError, match=rf"model\.{field} {saved!r} -> {value!r}\. Use another"
  ) as e:
    runconfig.check_resume_config(
      str(tmp_path), checked(tiny_experiment(**{f"model.{field}": value}))
    )
  assert "\n" not in str(e.value) and str(e.value).count("model.") == 1


def test_run_time_knobs_and_a_config_of_before_resume(tmp_path):
  saved = tiny_experiment()
  runconfig.save_config(str(tmp_path), checked(saved))
  runconfig.check_resume_config(
    str(tmp_path),
    checked(
      tiny_experiment(
        **{
          "model.dtype": "bfloat16",
          "model.remat": "full",
          "model.attention_chunk_size": 4,
          "model.dropout_rate": 0.1,
        }
      )
    ),
  )
  # A config.json written before model.norm existed ran with its default.
  values = json.load(open(tmp_path / "config.json"))
  del values["model"]["norm"]
  (tmp_path / "config.json").write_text(json.dumps(values))
  runconfig.check_resume_config(str(tmp_path), checked(tiny_experiment(**{"model.norm": "pre"})))
  with pytest.raises(ConfigError, match=r"model\.norm 'pre' -> 'post'"):
    runconfig.check_resume_config(str(tmp_path), checked(tiny_experiment(**{"model.norm": "post"})))


@pytest.mark.slow
def test_the_trainer_refuses_a_resume_with_scanned_layers_before_training(tmp_path):
  from compressive.training import loop as train_lib

  workdir = str(tmp_path / "wd")
  config = tiny_experiment(num_train_steps=2, checkpoint_every_steps=2, eval_every_steps=0)
  train_lib.train_and_evaluate(to_train(config), workdir)
  steps = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  config.model.scan_layers = True
  config.num_train_steps = 4
  with pytest.raises(ConfigError, match=r"model\.scan_layers False -> True\. Use another"):
    train_lib.train_and_evaluate(to_train(config), workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == steps
