"""What the hardware presets (gpu1.py, gpu8.py, tpu_v5e8.py) share: the
experiment named after ':' in `--config=gpu8:NAME`, one of the shipped
configs, imported from this package (never a top-level `configs`, which a
folder could shadow); an unknown name is an error that lists the names."""

import importlib
import os

import ml_collections

# The presets themselves: an experiment is any other shipped config.
PRESETS = ("gpu1", "gpu8", "tpu_v5e8")


def experiment_names() -> list[str]:
  """The shipped configs a preset can run: this folder's files that define
  get_config, less the presets."""
  here = os.path.dirname(os.path.abspath(__file__))
  names = []
  for file in sorted(os.listdir(here)):
    name, ext = os.path.splitext(file)
    if ext == ".py" and not name.startswith("_") and name not in PRESETS:
      with open(os.path.join(here, file), encoding="utf-8") as f:
        if "\ndef get_config(" in f.read():
          names.append(name)
  return names


def experiment(name: str) -> ml_collections.ConfigDict:
  """The shipped config NAME's get_config() ('' is 'default')."""
  name = name or "default"
  names = experiment_names()
  if name not in names:
    raise ValueError(
      f"no experiment config {name!r} for a hardware preset "
      f"(the part after ':' is one of: {', '.join(names)})"
    )
  return importlib.import_module(f"compressive.configs.{name}").get_config()
