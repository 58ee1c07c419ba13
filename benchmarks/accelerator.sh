#!/usr/bin/env bash
# The GPU check, one prepared script: at most 8 minutes on one H200.
#
#   bash benchmarks/accelerator.sh          # results under $OUT (default /tmp/accelerator)
#
# 1. A CUDA environment (.venv-gpu: requirements.txt, jax[cuda12], pytest).
# 2. The tests that matter on a GPU: the model's properties, the memory,
#    cached evaluation equal to uncached, scanned layers and chunked
#    attention equal to the plain paths (their tolerances are float32's; on a
#    GPU XLA may use TF32 for float32 matmuls, which the conftest's
#    "highest" matmul precision turns off).
# 3. benchmarks/accelerator.py: bf16 training at the reference config and
#    at a 6-layer slice of the enwik8 config: tokens/s, MFU against the
#    GPU's bf16 peak, peak device memory against the compiled step's
#    memory_analysis (aot.py's prediction).
# Each stage has its own time limit, so one stuck stage leaves the others
# their time; the exit code is the first failing stage's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/accelerator}"
mkdir -p "$OUT"
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
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
stage venv 150 bash -c 'python3 -m venv .venv-gpu && .venv-gpu/bin/pip install -q \
    -r requirements.txt "jax[cuda12]==0.10.2" pytest==9.2.0 hypothesis==6.170.17 \
    && .venv-gpu/bin/pip install -q --no-deps -e .'
PY=.venv-gpu/bin/python
stage tests 150 $PY -m pytest -q -x -p no:cacheprovider tests/test_model.py tests/test_memory.py \
    tests/test_eval_cache.py tests/test_scan_layers.py tests/test_attention_chunks.py
stage throughput 150 bash -c "$PY benchmarks/accelerator.py > '$OUT/accelerator.json'"
tail -n 1 "$OUT/accelerator.json"
exit $status
