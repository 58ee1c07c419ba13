"""The dry run: what a start would do, checked as a start checks it, with
nothing written, compiled or trained (train.py --dry_run)."""

from __future__ import annotations

from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive import remote
from compressive.errors import CheckpointError
from compressive.training import checkpoint as ckpt_lib
from compressive.training import layout, runconfig, writers
from compressive.training import setup as setup_lib


def dry_run(experiment: experiment_lib.Experiment, workdir: layout.Where) -> str:
  """What a start would do, checked as a start checks it (the data, every
  document read once; the model built abstractly on this machine's mesh; a
  resume's config against the workdir's), in one line; nothing is written,
  nothing compiled or trained."""
  data = experiment.data
  writers.resolve(experiment.train.metric_writers)
  tokenizer = data_lib.get_tokenizer(data)
  setup = setup_lib.build_setup(experiment)
  counts = {}
  for split in data_lib.SPLITS:
    docs = data_lib.get_documents(data, split, tokenizer)
    if split == "train":  # the iterator's own checks (enough documents for the batch's rows)
      data_lib.SegmentIterator(docs, experiment.train.batch_size, experiment.train.segment_length)
    if split in ("train", experiment.eval.split):  # what a start reads
      data_lib.check_documents(data, split, tokenizer)
    counts[split] = len(docs)
  steps = []
  run = layout.workdir(workdir)
  if remote.isdir(run.checkpoints):
    steps = ckpt_lib.Checkpointer(workdir, read_only=True).all_steps()
  if steps:
    try:
      runconfig.load_config(workdir)  # a damaged one a start would set aside: not here
    except (OSError, CheckpointError):
      pass
    else:
      runconfig.check_resume_config(workdir, experiment)
  device = setup.layout.mesh.devices.flat[0]
  where = f"resume {run.name} from step {steps[-1]}" if steps else f"start {run.name} afresh"
  return (
    f"dry run: would {where}: {setup.num_params:,} parameters, mesh "
    f"{dict(setup.layout.mesh.shape)} over {setup.layout.mesh.size} {device.platform} "
    f"devices ({device.device_kind}), {experiment.train.num_train_steps} steps; "
    f"{data_lib.describe(data, counts)}; nothing trained or written"
  )
