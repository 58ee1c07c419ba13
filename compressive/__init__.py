"""compressive: Compressive Transformers (Rae et al., ICLR 2020) in JAX/Flax."""

from compressive.config_lib import ConfigError, ModelConfig
from compressive.memory import Memory, init_memory, reset_rows
from compressive.model import CompressiveTransformer

__all__ = [
    "CompressiveTransformer",
    "ConfigError",
    "Memory",
    "ModelConfig",
    "init_memory",
    "load",
    "reset_rows",
]


def load(workdir: str, step=None, *, config=None):
  """(config, model) of a training workdir's latest (or given) checkpoint.

  The parameters are restored onto the saved config's mesh, or, if that
  does not fit this machine, data parallel over all its devices; `config`
  replaces the saved one (e.g. to choose the mesh).
  """
  from compressive import train_lib  # pylint: disable=g-import-not-at-top
  return train_lib.load(workdir, step, config=config)
