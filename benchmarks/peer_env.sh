#!/usr/bin/env bash
# Builds the virtual environment of the PyTorch peer benchmark
# (benchmarks/peer_pytorch.py, driven by benchmarks/compare_peer.py):
# torch 2.13.0 (CPU wheel) and lucidrains' compressive-transformer-pytorch
# 0.4.0. Idempotent: does nothing when the venv already has both.
#
#   bash benchmarks/peer_env.sh            # -> ~/.cache/compressive/peer-venv
#   PEER_VENV=/some/dir bash benchmarks/peer_env.sh
#
# Pin torch to an exact version: an unpinned `torch` may pull a CUDA build of
# several GB. numpy only silences torch's "Failed to initialize NumPy"
# warning. PEER_PYTHON chooses the interpreter that makes the venv.
set -euo pipefail

PEER_VENV="${PEER_VENV:-$HOME/.cache/compressive/peer-venv}"
PEER_PYTHON="${PEER_PYTHON:-python3}"
TORCH_VERSION="2.13.0"
PEER_VERSION="0.4.0"

check() {
  "$PEER_VENV/bin/python" - "$TORCH_VERSION" "$PEER_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
import numpy  # noqa: F401
import torch  # noqa: F401
import compressive_transformer_pytorch  # noqa: F401
assert version("torch").split("+")[0] == sys.argv[1], version("torch")
assert version("compressive-transformer-pytorch") == sys.argv[2]
EOF
}

if [[ -x "$PEER_VENV/bin/python" ]] && check; then
  echo "peer venv ready: $PEER_VENV"
  exit 0
fi

echo "building peer venv at $PEER_VENV" >&2
mkdir -p "$(dirname "$PEER_VENV")"
"$PEER_PYTHON" -m venv "$PEER_VENV"
"$PEER_VENV/bin/python" -m pip install --quiet --upgrade pip
"$PEER_VENV/bin/python" -m pip install --quiet \
  "torch==$TORCH_VERSION" "compressive-transformer-pytorch==$PEER_VERSION" "numpy==2.4.6"
if ! check; then
  echo "peer venv at $PEER_VENV is incomplete: torch==$TORCH_VERSION and" \
       "compressive-transformer-pytorch==$PEER_VERSION did not import" >&2
  exit 1
fi
"$PEER_VENV/bin/python" -c 'import torch; print("peer venv ready:", torch.__version__)'
echo "  $PEER_VENV"
