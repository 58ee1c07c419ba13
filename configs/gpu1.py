"""Preset: one GPU. Runs any experiment of configs/ on a single accelerator.

The part after ':' names the experiment (a module in configs/; default
'default'); this preset only says where and how it runs:

    python train.py --config=configs/gpu1.py:enwik8 --workdir=runs/enwik8
    python train.py --config=configs/gpu1.py --workdir=runs/default

Mesh (1, 1, 1); activations in bfloat16 (parameters and optimizer state stay
float32). The paper-size models keep the experiment's batch (32 rows); if
they do not fit your GPU's memory, lower it, e.g. --config.batch_size=16
(the learning rate is not rescaled for you). Not run on a GPU by us; compiled
for one H100 80 GB by aot.py, where enwik8 and pg19 take 32 GiB (docs/SCALING.md
§Before renting the hardware).
"""

import ml_collections

from compressive.configs import _hardware


def get_config(experiment: str = "default") -> ml_collections.ConfigDict:
  config = _hardware.experiment(experiment)
  config.mesh.shape = (1, 1, 1)
  config.model.dtype = "bfloat16"
  return config
