"""compressive: Compressive Transformers (Rae et al., ICLR 2020) in JAX/Flax."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Iterable, Optional

from compressive.errors import ConfigError
from compressive.model import sampling
from compressive.model.config import ModelConfig
from compressive.model.memory import Memory, init_memory, reset_rows
from compressive.model.transformer import CompressiveTransformer

if TYPE_CHECKING:
  from compressive.experiment import Experiment
  from compressive.training import runconfig

# `compressive.sampling` stays importable by its public name (docs/EVALUATION.md §From
# Python); the module lives in the model layer.
sys.modules.setdefault(__name__ + ".sampling", sampling)

# The package's version (pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = [
  "__version__",
  "CompressiveTransformer",
  "ConfigError",
  "Memory",
  "ModelConfig",
  "init_memory",
  "load",
  "load_with_step",
  "reset_rows",
  "sampling",
]


def load(
  workdir: str,
  step: Optional[int] = None,
  *,
  config: Optional[runconfig.SavedConfig] = None,
  plugins: Iterable[str] = (),
) -> tuple[Experiment, CompressiveTransformer]:
  """(experiment, model) of a training workdir's latest (or given)
  checkpoint, or of an export (export.py: parameters only) made from one:
  the run's saved config, checked (an Experiment: its typed groups), and
  the model in evaluation mode.

  The parameters are restored onto the saved config's mesh, or, if that
  does not fit this machine, data parallel over all its devices; `config`
  replaces the saved one (e.g. to choose the mesh). What was saved is
  verified (checksums, finite values) and so is the run's identity (the
  model and data config, the tokenizer). A saved config naming a plugin as
  `module:Name` never imports its module: import it first, or name it in
  `plugins` (modules to import, as the tools' --plugin flag).
  """
  experiment, model, _ = load_with_step(workdir, step, config=config, plugins=plugins)
  return experiment, model


def load_with_step(
  workdir: str,
  step: Optional[int] = None,
  *,
  config: Optional[runconfig.SavedConfig] = None,
  plugins: Iterable[str] = (),
) -> tuple[Experiment, CompressiveTransformer, int]:
  """(experiment, model, step): `load`, and the step whose parameters it holds."""
  from compressive import config as config_lib
  from compressive import plugins as plugins_lib
  from compressive.training import opening

  plugins_lib.trust(plugins)
  with plugins_lib.saved_config():
    experiment = None if config is None else config_lib.check_to_read(config)
    run = opening.open_run(workdir, step, experiment=experiment)
  return run.experiment, run.model, run.step
