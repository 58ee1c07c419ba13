"""Preset: a Cloud TPU v5e-8 (one host, 8 chips of 16 GB). Runs any
experiment of configs/.

The part after ':' names the experiment (a module in configs/; default
'default'):

    python train.py --config=configs/tpu_v5e8.py:enwik8 --workdir=runs/enwik8 \
        --config.data.enwik8.path=/data/enwik8.zip

Mesh (1, 8, 1), FSDP: batch rows split over the 8 chips as in data
parallelism, and parameters and Adam state split 8 ways too (a full copy,
10 GB for the PG-19 model, would not leave a 16 GB chip room for
activations); XLA gathers each layer's weights as the step reaches it.
'(1,4,2)' also splits attention heads and MLP units over pairs of chips,
halving the attention activations per chip. Activations in bfloat16. Not run
on a TPU by us; compiled for a v5e-8 by aot.py, where enwik8 takes 5.8 GiB
a chip and pg19 5.4 of the 15.75 (docs/SCALING.md §Before renting the hardware).
"""

import ml_collections

from compressive.configs import _hardware


def get_config(experiment: str = "default") -> ml_collections.ConfigDict:
  config = _hardware.experiment(experiment)
  config.mesh.shape = (1, 8, 1)
  config.model.dtype = "bfloat16"
  return config
