"""One way to open a trained run: a training workdir's checkpoint, or an
export of one (export.py), as a model in evaluation mode.

Every reader opens a run here: `compressive.load`, eval.py, sample.py,
analyze.py, and export.py (exporting.export). The run is
opened as an Experiment (the tools pass the one config.check_saved made
ready; a library caller's config, or the saved one, is checked here as a
config read on this machine), whose setup (setup.build_setup: the train
state's shapes on the mesh, no arrays) the checkpoint or the export is
restored onto. The abstract model is built once, by that check.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from compressive import experiment as experiment_lib
from compressive import files
from compressive.model.transformer import CompressiveTransformer
from compressive.training import export as export_lib
from compressive.training import inference, layout


@dataclasses.dataclass(frozen=True, eq=False)
class OpenRun:
  """A trained run, opened: the experiment it was opened as, its model with
  the step's parameters, and the step."""

  experiment: experiment_lib.Experiment
  model: CompressiveTransformer
  step: int


def open_run(
  path: layout.Where,
  step: Optional[int] = None,
  *,
  experiment: Optional[experiment_lib.Experiment] = None,
) -> OpenRun:
  """The run at `path` (a training workdir or an export), at its checkpoint
  `step` (default the newest; an export holds one), as an OpenRun. `path`
  may be a gs:// URL (its files read through a local mirror,
  layout.opened), or the Workdir a caller opened.

  `experiment`: the Experiment to open it as (a tool's, from
  config.check_saved; a library caller's, from config.check_to_read: its
  model must match the run's), or None for the saved config (refitted to
  this machine's devices when its mesh does not fit them). What is read is
  verified: checksums, finite values, the run's identity (model, data config,
  tokenizer).
  """
  if not isinstance(path, layout.Workdir):
    path = os.fspath(path)
    files.check_local(path, "a workdir or an export", remote_ok=True)
    with layout.opened(path) as place:  # gs://: its small files read through a local mirror
      return open_run(place, step, experiment=experiment)
  is_export = export_lib.is_export(path)
  if is_export:  # a damaged export, or one of another step, is named before the rest
    export_lib.manifest_of_step(path, step)
  experiment = experiment or inference.saved_experiment(path)
  opener = export_lib.open_export if is_export else inference.open_workdir
  model, step = opener(path, experiment, step)
  return OpenRun(experiment=experiment, model=model, step=step)
