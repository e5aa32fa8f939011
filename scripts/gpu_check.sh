#!/usr/bin/env bash
# Step 2 of the GPU check, run ON THE GPU MACHINE from the repository's root, as it is:
#
#   scripts/gpu_check.sh              # with .gpu-wheels/ carried in (scripts/gpu_wheels.sh made it)
#   scripts/gpu_check.sh --rehearse   # here, on the CPU: every step, with agent.device = cpu (GPU_CHECK_PYTHON:
#                                     # a Python like the GPU machine's, without the carried packages)
#
# Where torch sees no CUDA device it says "no CUDA", lists what it would run and exits 0. Where it sees one it
#   1. installs what the machine lacks from .gpu-wheels/ into a venv of its own under /tmp that also sees the
#      machine's Python packages (PyTorch with CUDA among them): mpiexec lands beside that venv's python;
#   2. runs the tests marked cuda (tests/test_cuda.py: short jobs with the networks on the GPU through every role);
#   3. runs `mpirl bench learner --device cuda` (our train step against a bare PyTorch step on the same GPU);
#   4. runs `mpirl bench gpu` (Ape-X, IMPALA and PPO steps against bare ones, bf16, the frame cache on the device,
#      an inference worker's forward pass on the GPU against the CPU);
#   5. with GPU_CHECK_JOBS_S set, runs scripts/gpu_jobs.py (whole Pong jobs, the learner on the GPU then the CPU);
# each part under a timeout (GPU_CHECK_TESTS_S, GPU_CHECK_BENCH_S, GPU_CHECK_GPU_S: 200 + 160 + 200 s; on the H200
# on 2026-11-28 the venv took seconds, the parts 71 + 108 + 91 s, the whole check 296 s), and writes its log, the
# tests' JUnit XML and the benches' HDF5 to $OUT (default ./gpu-check-out). It exits 0 when every test passed and
# both benches ran.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
REHEARSE=0
case "${1:-}" in
  --rehearse) REHEARSE=1 ;;
  "") ;;
  *) echo "usage: scripts/gpu_check.sh [--rehearse]" >&2; exit 2 ;;
esac
# Seconds for the cuda tests (71 s on an H200 with 8 workers), then the benches' (0: that bench not run); the
# rehearsal on a CPU takes longer for the same steps.
if [ "$REHEARSE" = 1 ]; then TESTS_S=${GPU_CHECK_TESTS_S:-300} GPU_S=${GPU_CHECK_GPU_S:-600}
else TESTS_S=${GPU_CHECK_TESTS_S:-200} GPU_S=${GPU_CHECK_GPU_S:-200}; fi
BENCH_S=${GPU_CHECK_BENCH_S:-160}

PY=${GPU_CHECK_PYTHON:-python3}  # here: the project's venv; there: the machine's python3
[ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ] && PY=$ROOT/.venv/bin/python
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.gpu-wheels}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
PYTEST=(-m pytest tests/test_cuda.py -m cuda -o addopts= -p no:cacheprovider -ra)

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch: run it with the project's venv here, or with the GPU machine's python3"
  exit 1
fi
cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
if [ "$cuda" != 1 ] && [ "$REHEARSE" = 0 ]; then
  echo "gpu_check: no CUDA: torch $("$PY" -c 'import torch; print(torch.__version__)') sees no CUDA device on this" \
       "machine; nothing run. On a GPU machine it would run these tests (tests/test_cuda.py, marked cuda):"
  "$PY" "${PYTEST[@]}" --collect-only -q 2>/dev/null | grep '::' | sed 's/^/  /'
  echo "and then: $PY -m mpirl bench learner --device cuda --reps 5 --out \$OUT/bench_learner.h5"
  echo "and then: $PY -m mpirl bench gpu --reps 5 --out \$OUT/bench_gpu.h5, which measures:"
  "$PY" -c "from mpirl.bench.gpu import plan; print('\n'.join('  - ' + line for line in plan()))"
  echo "and, with GPU_CHECK_JOBS_S set: $PY scripts/gpu_jobs.py --devices cuda,cpu (whole Pong jobs, IMPALA and PPO)"
  n=$(ls "$WHEELS"/*.whl 2>/dev/null | wc -l)
  echo "gpu_check: $WHEELS holds $n wheels ($(du -sh "$WHEELS" 2>/dev/null | cut -f1 || echo 0));" \
       "scripts/gpu_wheels.sh makes them"
  exit 0
fi
DEVICE=cuda
if [ "$REHEARSE" = 1 ]; then
  DEVICE=cpu
  export MPIRL_CUDA_TESTS_ON=cpu
  echo "gpu_check: rehearsal: the same steps with agent.device = cpu and the bench on the CPU"
fi

echo "gpu_check: $(date -u +%FT%TZ) on $(hostname), $(getconf _NPROCESSORS_ONLN) cores"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$PY" -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if c else '(no device)')"

# 1. A venv of its own that also sees this Python's packages; the carried wheels into it.
if ! "$PY" -c "import gymnasium, pettingzoo, ale_py" 2>/dev/null || [ ! -x "$(dirname "$PY")/mpiexec" ]; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "gpu_check: no wheels in $WHEELS: run scripts/gpu_wheels.sh first and carry .gpu-wheels in"; exit 1
  fi
  VENV=/tmp/mpirl-gpu-venv
  rm -rf "$VENV"
  "$PY" -m venv --without-pip "$VENV" || exit 1
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$PY" -c "import site, sys; print('\n'.join(site.getsitepackages() + [p for p in sys.path if p.endswith('-packages')]))" \
    | awk '!seen[$0]++' > "$site/machine-packages.pth"
  "$VENV/bin/python" -m pip install --quiet --no-index --no-deps --ignore-installed --no-compile \
    --disable-pip-version-check "$WHEELS"/*.whl || exit 1
  PY=$VENV/bin/python
  echo "gpu_check: installed $(ls "$WHEELS"/*.whl | wc -l) wheels into $VENV (it sees $(wc -l < "$site/machine-packages.pth") package folders of the machine's Python)"
fi
"$PY" -c "import torch, mpi4py.MPI as M, gymnasium, pettingzoo, ale_py, h5py, numba; print('python', '.'.join(map(str, __import__('sys').version_info[:3])), 'mpi4py', __import__('mpi4py').__version__, M.Get_library_version().splitlines()[0], 'gymnasium', gymnasium.__version__)" || exit 1
"$(dirname "$PY")/mpiexec" -n 2 --oversubscribe "$PY" -c "from mpi4py import MPI; w = MPI.COMM_WORLD; print('rank', w.rank, 'of', w.size)" || exit 1

# 2. The cuda tests.
start=$(date +%s)
timeout -k 10 "$TESTS_S" "$PY" "${PYTEST[@]}" -n "${GPU_CHECK_WORKERS:-6}" --dist load --durations=0 --junitxml="$OUT/cuda_tests.xml"
tests_rc=$?
echo "gpu_check: cuda tests exit $tests_rc after $(( $(date +%s) - start )) s"

# 3 and 4. A bench under its timeout (0 seconds: not run): bench_part NAME SECONDS WHAT; its exit in $part_rc.
bench_part() {
  part_rc=0
  if [ "$2" = 0 ]; then echo "gpu_check: no $1 bench (its seconds are 0)"; return; fi
  local start=$(date +%s)
  timeout -k 10 "$2" "$PY" -m mpirl bench "$1" --device "$DEVICE" --reps 5 --out "$OUT/bench_$1.h5"
  part_rc=$?
  echo "gpu_check: $1 bench exit $part_rc after $(( $(date +%s) - start )) s ($3)"
}
# 3. The learner bench on the GPU: ours against a bare PyTorch step, same network, batch and device.
bench_part learner "$BENCH_S" "our train step against a bare PyTorch step"; bench_rc=$part_rc
# 4. The gpu bench: every family's step against a bare one, bf16, the frame cache, an inference worker's pass
#    (the rehearsal: the same at tiny sizes on the CPU).
bench_part gpu "$GPU_S" "Ape-X, IMPALA and PPO steps, bf16, the frame cache, an inference worker"; gpu_rc=$part_rc
# 5. Whole Pong jobs (IMPALA, PPO) with the learner on the GPU, then on the CPU: only where GPU_CHECK_JOBS_S gives
#    them seconds (about 260 on the H200's 16 cores; 0, the default: not run, so the check fits one 10-minute call).
JOBS_S=${GPU_CHECK_JOBS_S:-0}
jobs_rc=0
if [ "$JOBS_S" != 0 ]; then
  start=$(date +%s)
  devices=$([ "$REHEARSE" = 1 ] && echo cpu || echo cuda,cpu)
  timeout -k 10 "$JOBS_S" "$PY" scripts/gpu_jobs.py --devices "$devices" --ranks "$(getconf _NPROCESSORS_ONLN)" \
    ${GPU_CHECK_JOBS_WALL:+--wall "$GPU_CHECK_JOBS_WALL"}
  jobs_rc=$?
  echo "gpu_check: whole jobs exit $jobs_rc after $(( $(date +%s) - start )) s"
fi
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ] && [ "$gpu_rc" = 0 ] && [ "$jobs_rc" = 0 ]
