#!/usr/bin/env bash
# The wheels that benchmarks/accelerator.sh needs on the GPU machine and that
# its image lacks. Run it HERE, where pip reaches PyPI; the GPU machine
# reaches no network.
#
#   bash benchmarks/gpu_wheels.sh           # into .whl/ (WHEELS=DIR for another)
#
# WHEELS_PYTHON=3.11 fetches the same for Python 3.11 instead, for a dry run
# of accelerator.sh's mechanics on a machine without a GPU.
#
# The GPU machine's Python 3.12 (python3) already has jax, jaxlib and the
# CUDA plugin, flax, optax, orbax-checkpoint, absl-py, numpy, protobuf,
# packaging, pyyaml, psutil, cloudpickle, etils, sentencepiece, matplotlib,
# pytest and hypothesis. What it lacks: ml_collections, tensorboardX and
# grain (compressive/data/prefetch.py), at requirements.txt's pins, and
# grain's two missing dependencies, array_record and portpicker. Each is fetched
# as a cp312 manylinux x86-64 wheel (or py3-none-any), without dependencies;
# the script then checks every wheel's Requires-Dist against what is fetched
# plus what that machine already has, and prints the total size (the working
# tree that travels to the machine may hold 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="${WHEELS:-.whl}"
PY="${PYTHON:-python3}"
TARGET="${WHEELS_PYTHON:-3.12}"

pin() {  # pin NAME [DEFAULT]: NAME==VERSION as requirements.txt pins it, else DEFAULT
  local line
  line=$(grep -iE "^$1==" requirements.txt) && { echo "$line"; return; }
  [ -n "${2:-}" ] || { echo "requirements.txt pins no $1" >&2; exit 1; }
  echo "$2"
}
PACKAGES=(
  "$(pin ml_collections)"
  "$(pin tensorboardX)"
  "$(pin grain grain==0.2.18)"
  array_record==0.8.6   # grain's; a cp312 manylinux_2_17 wheel
  portpicker==1.6.0     # grain's; needs psutil (there)
)
# Requirements that the GPU machine's image already satisfies (KINDS.md,
# "Python packages already there"), normalised names. grain and array_record
# ask for etils[epath,epy], whose extras need fsspec, typing-extensions and
# zipp (etils 1.15), all there too (its orbax-checkpoint asks the same).
THERE="absl-py cloudpickle etils numpy protobuf psutil pyyaml packaging"

# Start from an empty folder: two versions of one package stop the install.
mkdir -p "$WHEELS"
rm -f "$WHEELS"/*.whl
"$PY" -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$TARGET" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 \
    -d "$WHEELS" "${PACKAGES[@]}"

"$PY" - "$WHEELS" "$THERE" "$TARGET" <<'EOF'
import glob, os, re, sys, zipfile
try:
  from packaging.requirements import Requirement
except ImportError:
  from pip._vendor.packaging.requirements import Requirement

folder, there, target = sys.argv[1], sys.argv[2].split(), sys.argv[3]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
env = dict(python_version=target, python_full_version=target + ".0", implementation_name="cpython",
           platform_python_implementation="CPython", sys_platform="linux",
           platform_system="Linux", platform_machine="x86_64", os_name="posix", extra="")
wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
have = {norm(os.path.basename(w).split("-")[0]) for w in wheels}
missing, total = [], 0
for wheel in wheels:
  size = os.path.getsize(wheel)
  total += size
  with zipfile.ZipFile(wheel) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
  needs = []
  for line in meta.splitlines():
    if not line.startswith("Requires-Dist:"):
      continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate(env):
      continue  # an extra, or another Python or platform
    needs.append(norm(req.name))
    if norm(req.name) not in have and norm(req.name) not in there:
      missing.append(f"{req} (for {os.path.basename(wheel)})")
  print(f"{size / 2**20:7.2f} MiB  {os.path.basename(wheel)}  needs: {', '.join(needs) or '-'}")
print(f"{total / 2**20:7.2f} MiB  in {len(wheels)} wheels under {folder}/")
if missing:
  sys.exit("neither fetched nor on the GPU machine: " + "; ".join(missing))
if total > 48 * 2**20:
  sys.exit(f"{total / 2**20:.1f} MiB of wheels: too close to the 64 MiB the working tree may hold")
EOF
