#!/usr/bin/env bash
# The GPU check, one prepared script: at most 8 minutes on one H200.
#
#   bash benchmarks/gpu_wheels.sh           # once, HERE (PyPI reachable): .whl/
#   bash benchmarks/accelerator.sh          # THERE, with .whl/ carried; results under
#                                           # $OUT (default /tmp/accelerator)
#
# The GPU machine reaches no network, so nothing is built or fetched there:
# the script runs that machine's own Python (PYTHON, default python3, which
# has JAX with its CUDA plugin, flax, optax, orbax-checkpoint, pytest and
# hypothesis), installs only the small wheels carried in WHEELS (default
# .whl: ml_collections, tensorboardX, grain and grain's missing dependencies,
# from benchmarks/gpu_wheels.sh) into a temporary folder with pip
# --no-index --no-deps --target, and finds this project itself through
# PYTHONPATH (the repository root: `compressive`, whose configs are configs/, and `benchmarks`).
#
# 1. env: the carried wheels, then the imports and versions (jax, jaxlib,
#    flax, optax, orbax-checkpoint, ...) and the devices. Fails with one
#    line naming what is missing and how to fetch it, or when JAX sees no
#    GPU; the later stages then do not run.
# 2. tests: the ones that matter on a GPU: the model's properties, the
#    memory, cached evaluation equal to uncached, scanned layers and chunked
#    attention equal to the plain paths (their tolerances are float32's; on a
#    GPU XLA may use TF32 for float32 matmuls, which the conftest's
#    "highest" matmul precision turns off). With 4 pytest-xdist workers
#    where it is installed (ACCELERATOR_TEST_WORKERS for another number).
# 3. throughput: benchmarks/accelerator.py: bf16 training at the reference
#    config and at a 6-layer slice of the enwik8 config: tokens/s, MFU
#    against the GPU's bf16 peak, peak device memory against the compiled
#    step's memory_analysis (aot.py's prediction).
# Each stage has its own time limit (60 + 200 + 200 s), so one stuck stage
# leaves the others their time; the exit code is the first failing stage's.
#
# For a dry run of the mechanics without a GPU: ACCELERATOR_ALLOW_CPU=1 lets
# the env stage pass on a CPU backend; PYTEST_ADDOPTS (pytest's own) and
# ACCELERATOR_FLAGS (extra flags for accelerator.py, e.g. "--cases=reference
# --rounds=1 --steps=1") make the later stages short.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT="${OUT:-/tmp/accelerator}"
export PY="${PYTHON:-python3}"
export WHEELS="${WHEELS:-.whl}"
export SITE
SITE=$(mktemp -d "${TMPDIR:-/tmp}/compressive-site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 PIP_ROOT_USER_ACTION=ignore
mkdir -p "$OUT"
: > "$OUT/summary.txt"
status=0
stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
  tail -n 3 "$OUT/$name.log"
  return $rc
}

# What the env stage checks: every import the tests and the benchmark need,
# the versions, the devices. Its last line says what is wrong, if anything.
read -r -d '' ENV_CHECK <<'EOF'
import importlib, importlib.metadata as md, os, sys
# import name -> distribution (what to download for it)
NEEDED = {"jax": "jax", "jaxlib": "jaxlib", "flax": "flax", "optax": "optax",
          "orbax.checkpoint": "orbax-checkpoint", "ml_collections": "ml_collections",
          "tensorboardX": "tensorboardX", "grain": "grain", "absl": "absl-py",
          "numpy": "numpy", "yaml": "pyyaml", "etils.epath": "etils", "pytest": "pytest"}
missing = []
for module, dist in NEEDED.items():
  try:
    if getattr(importlib.import_module(module), "__file__", None) is None:
      raise ImportError("only a folder of that name (a namespace package)")
  except Exception as e:  # a missing package, or one whose own needs are missing
    missing.append(f"{dist} ({type(e).__name__}: {e})")
if missing:
  sys.exit("MISSING on this machine: " + "; ".join(missing) + ". Fetch the wheels where pip"
           " reaches PyPI: `bash benchmarks/gpu_wheels.sh` (for others: python3 -m pip download"
           " --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform"
           " manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
           " -d .whl NAME==VERSION) and carry .whl")
for module in ("compressive", "compressive.configs.default", "benchmarks.common"):
  try:
    importlib.import_module(module)
  except Exception as e:
    sys.exit(f"this project does not import here: {module}: {type(e).__name__}: {e}")
import jax
def version(dist):
  try:
    return md.version(dist)
  except md.PackageNotFoundError:
    return None
print("python", sys.version.split()[0], sys.executable)
for dist in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
             "jax-cuda12-pjrt", "flax", "optax", "orbax-checkpoint", "ml_collections",
             "tensorboardX", "grain", "array_record", "portpicker", "numpy", "pytest",
             "hypothesis"):
  if version(dist):
    print(f"{dist} {version(dist)}")
print("compressive from", os.path.dirname(importlib.import_module("compressive").__file__))
site = os.environ.get("SITE")
carried = sorted(name for name in sys.modules if "." not in name and site
                 and (getattr(sys.modules[name], "__file__", None) or "").startswith(site))
print("from the carried wheels:", ", ".join(carried) or "none")
backend = jax.default_backend()
devices = jax.devices()
print("backend", backend, "devices", devices, [d.device_kind for d in devices])
if backend != "gpu":
  message = f"NO GPU visible to JAX: backend {backend}, devices {devices}"
  if os.environ.get("ACCELERATOR_ALLOW_CPU") == "1":
    print(message, "(ACCELERATOR_ALLOW_CPU=1: going on)")
  else:
    sys.exit(message)
EOF
export ENV_CHECK

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
# The carried wheels (none is fine if the machine has them all), then the check.
if ! stage env 60 bash -c '
    set -e
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    echo "${#wheels[@]} wheels in $WHEELS -> $SITE"
    if [ ${#wheels[@]} -gt 0 ]; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --disable-pip-version-check --target "$SITE" "${wheels[@]}" || {
        v=$("$PY" -c "import sys; print(\"%d.%d\" % sys.version_info[:2])")
        echo "the wheels in $WHEELS do not install with $PY (Python $v): fetch them for it" \
             "where pip reaches PyPI: WHEELS_PYTHON=$v bash benchmarks/gpu_wheels.sh"
        exit 3; }
    fi
    exec "$PY" -c "$ENV_CHECK"'; then
  echo "env failed: tests and throughput not run" | tee -a "$OUT/summary.txt"
  exit $status
fi
# All of them, not -x: one device run should show every failure (-rfE lists
# them at the end of tests.log). Their time is mostly compilation: with
# pytest-xdist (in the GPU machine's image) 4 workers compile side by side on
# its 16 cores, sharing the one GPU, so none preallocates 75% of its memory.
XDIST=()
if "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n "${ACCELERATOR_TEST_WORKERS:-4}"); fi
stage tests 200 env XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m pytest -q -rfE -p no:cacheprovider \
    "${XDIST[@]}" tests/model/test_model.py tests/model/test_memory.py \
    tests/evaluation/test_eval_cache.py tests/model/test_scan_layers.py \
    tests/model/test_attention_chunks.py
# shellcheck disable=SC2086  # ACCELERATOR_FLAGS is a list of flags
stage throughput 200 bash -c "\"\$PY\" benchmarks/accelerator.py ${ACCELERATOR_FLAGS:-} > '$OUT/accelerator.json'"
tail -n 1 "$OUT/accelerator.json" 2>/dev/null
exit $status
