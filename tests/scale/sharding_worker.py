"""Trains the sharding tests' tiny experiment on given meshes, in its own process.

test_sharding.py runs this with fake CPU devices (JAX_NUM_CPU_DEVICES=8,
JAX's jax_num_cpu_devices), which must be set before JAX starts and so
cannot be set inside the pytest process:

    python tests/scale/sharding_worker.py RUNS_JSON

RUNS_JSON is a list of {"workdir": DIR, "mesh": [data, fsdp, tensor]} run in
order with train_lib.train_and_evaluate (a workdir holding checkpoints
resumes). Prints one JSON line: the device count and each run's final
evaluation.
"""

import json
import os
import sys

# Run by path, so it finds tests/ (helpers.py) from where it is: tests/scale/.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository root: this tree's package
sys.path.insert(0, TESTS)

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")  # as conftest.py

from compressive import cli  # noqa: E402

# The session's compilation cache, as the entry points the tests start use
# it: the resume on mesh (4, 1, 2) loads what the run from scratch on that
# mesh compiled, instead of compiling it again (about 25 s of 8-device
# compiles on 2 cores).
cli.use_compilation_cache(None)

from compressive.training import loop as train_lib  # noqa: E402
from helpers import sharding_experiment, to_train  # noqa: E402


def main(runs_json: str) -> None:
  results = []
  for run in json.loads(runs_json):
    config = sharding_experiment(**{"mesh.shape": tuple(run["mesh"])})
    results.append(train_lib.train_and_evaluate(to_train(config), run["workdir"]))
  print(json.dumps({"devices": jax.device_count(), "results": results}))


if __name__ == "__main__":
  main(sys.argv[1])
