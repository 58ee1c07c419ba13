"""Compressions the recall study tries before any is made part of the package
(model.compression=experiments.compressions:NAME, imported on demand; the
tools run from the repository's root, where `experiments` is importable)."""

from compressive.model import compression


class Overlap3MaxPool(compression.OverlapMaxPool):
  """overlap_max_pool over three groups (3c slots, stride c)."""

  name = "overlap3_max_pool"
  window = 3
