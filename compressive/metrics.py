"""One writer for metrics: TensorBoard event files, a JSON-lines file, and a
readable log line."""

from __future__ import annotations

import json
import logging
import os
from typing import Mapping

_log = logging.getLogger("compressive")


class MetricWriter:
  """Writes scalars to `<workdir>/tensorboard/<name>` and
  `<workdir>/metrics_<name>.jsonl`; `enabled=False` on non-writing processes."""

  def __init__(self, workdir: str, name: str = "train", enabled: bool = True):
    self.enabled = enabled
    self.logdir = os.path.join(workdir, "tensorboard", name)
    self.jsonl = os.path.join(workdir, f"metrics_{name}.jsonl")
    self._tf_writer = None
    if enabled:
      os.makedirs(self.logdir, exist_ok=True)

  def _tensorboard(self):
    if self._tf_writer is None:
      # TensorFlow is heavy: import it only when the first scalars arrive.
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.config.set_visible_devices([], "GPU")
      self._tf = tf
      self._tf_writer = tf.summary.create_file_writer(self.logdir)
    return self._tf_writer

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    with open(self.jsonl, "a") as f:
      f.write(json.dumps({"step": int(step), **scalars}) + "\n")
    writer = self._tensorboard()
    with writer.as_default():
      for k, v in scalars.items():
        self._tf.summary.scalar(k, v, step=int(step))
    writer.flush()

  def close(self) -> None:
    if self._tf_writer is not None:
      self._tf_writer.close()


def read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
