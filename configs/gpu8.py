"""Preset: one node of 8 GPUs, data parallel. Runs any experiment of configs/.

The part after ':' names the experiment (a module in configs/; default
'default'):

    python train.py --config=configs/gpu8.py:pg19 --workdir=runs/pg19 \
        --config.data.pg19.data_dir=/data/tfds --config.data.spm_model=/data/pg19_32k.model

Mesh (8, 1, 1): each GPU holds batch_size / 8 rows and their memories, and a
full copy of the parameters and Adam state (about 16 bytes per parameter:
5.6 GB for the enwik8 model's 353M, 10 GB for PG-19's 632M), which fits
40 and 80 GB GPUs; gradients are averaged across GPUs once per update. For a
model too big for that, shard parameters and optimizer state instead with
--config.mesh.shape='(1,8,1)' (FSDP), or split heads and MLP units too with
'(1,4,2)'. Activations in bfloat16. Not run on GPUs by us; compiled for 8
H100 80 GB by aot.py, where enwik8 takes 8.7 GiB a GPU and pg19 12.6 (docs/SCALING.md
§Before renting the hardware).
"""

import ml_collections

from compressive.configs import _hardware


def get_config(experiment: str = "default") -> ml_collections.ConfigDict:
  config = _hardware.experiment(experiment)
  config.mesh.shape = (8, 1, 1)
  config.model.dtype = "bfloat16"
  return config
