#!/usr/bin/env bash
# Checks the NCCL transport on this machine's GPU(s). From anywhere:
#   scripts/gpu-check.sh
# Without a GPU (nvidia-smi finds none) it says so in one line and exits 0. With one:
# 1. configures a Release build in build/gpu with CUDA and NCCL (fails if the NCCL transport,
#    target meshcast_nccl, is not built: nvcc, the CUDA toolkit or NCCL not found), builds all;
# 2. runs every GPU test (ctest -L gpu: tests/gpu's single-GPU suite and the benchmark's smoke
#    run), where a skip is a failure; then reshard_mpi's random reshards on the NCCL transport
#    at 1 rank (mpirun -np 1), and the NCCL reshard tests at 2, 4 and 8 ranks (each skips when
#    there are fewer GPUs than ranks);
# 3. runs `meshcast-nccl sync --verify` at one rank (GPT-2 small, every tensor copied on GPU 0,
#    in each mode) and the one-GPU benchmark (build/gpu/bin/gpu_reshard_bench: the copy kernel,
#    a strided send to itself and a one-device reshard against cudaMemcpy, with every element
#    checked) on boxes of 4 KiB rows, 64-byte rows and 4-byte rows (the worst case: no access
#    wider than one f32).
# Needs no network. Environment: MESHCAST_GPU_BENCH_BYTES, the benchmark's largest size (bytes,
# default its own: 1 GiB); JOBS, build jobs (default: the number of cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [[ ${gpus:-0} -eq 0 ]]; then
  echo "gpu-check: no GPU on this machine (nvidia-smi found none); nothing to check"
  exit 0
fi

build=build/gpu
jobs=${JOBS:-$(nproc)}
t_all=$(date +%s)
fail() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}
step() { echo; echo "=== gpu-check: $*"; }

step "$gpus GPU(s)"
nvidia-smi -L

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v c++ >/dev/null || missing+=("a C++ compiler (c++)")
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || missing+=("nvcc (CUDA toolkit)")
[[ ${#missing[@]} -eq 0 ]] || fail "missing: ${missing[*]}"

step "configure $build (Release, CUDA + NCCL)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON -DMESHCAST_WITH_NCCL=ON \
  -DMESHCAST_BUILD_BENCH=ON
[[ -d $build/collectives/CMakeFiles/meshcast_nccl.dir ]] ||
  fail "the NCCL transport (meshcast_nccl) is not configured: CMake found no nvcc, CUDA toolkit or NCCL (see 'NCCL backend not built' above)"

step "build ($jobs jobs)"
cmake --build "$build" -j "$jobs"
[[ -x $build/tests/gpu_tests ]] || fail "$build/tests/gpu_tests was not built (tests/gpu is not registered in tests/CMakeLists.txt)"

step "ctest -L gpu"
log=$build/gpu-ctest.log
(cd "$build" && ctest -L gpu --output-on-failure) 2>&1 | tee "$log" || fail "GPU tests (ctest -L gpu)"
if grep -q '(Skipped)' "$log"; then
  grep '(Skipped)' "$log" >&2
  fail "GPU tests skipped on a machine with a GPU (see above)"
fi

reshard_mpi=$build/tests/reshard_mpi
mpiexec=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")
if [[ -x $reshard_mpi && -n $mpiexec ]]; then
  step "reshard_mpi nccl at 1 rank (random reshards, every element checked)"
  rc=0
  "$mpiexec" --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    -np 1 "$reshard_mpi" nccl 250 20261121 || rc=$?
  [[ $rc -eq 0 ]] || fail "reshard_mpi nccl -np 1 (exit $rc; 77: NCCL could not use the GPU)"
  step "NCCL reshard tests at 2, 4 and 8 ranks (skipped where ranks would share a GPU)"
  (cd "$build" && ctest -R '^mpi\.reshard\.nccl\.' --output-on-failure) || fail "mpi.reshard.nccl"
else
  step "reshard_mpi not built (no MPI): its single-rank NCCL run is left out"
fi

step "meshcast-nccl sync on one GPU (GPT-2 small, each mode, every element checked)"
model=$build/gpt2-small-one-gpu.json
python3 - models/gpt2-small.json "$model" <<'PY'
import json, sys
whole = lambda n: "1@0:" + "R" * n  # every tensor on GPU 0, on both sides: local copies
m = json.load(open(sys.argv[1]))
json.dump({k: {"shape": v["shape"], "dtype": v["dtype"], "src": whole(len(v["shape"])),
               "dst": whole(len(v["shape"]))} for k, v in m.items()}, open(sys.argv[2], "w"))
PY
for mode in fused per-tensor gather; do
  MESHCAST_RANK=0 MESHCAST_SIZE=1 MESHCAST_RENDEZVOUS=127.0.0.1:29511 "$build/bin/meshcast-nccl" \
    sync --model "$model" --mode $mode --backend nccl --verify --iters 20 ||
    fail "meshcast-nccl sync --mode $mode"
done

for cols in 1024 16 1; do
  step "one-GPU benchmark, boxes of $cols f32 columns"
  "$build/bin/gpu_reshard_bench" --cols $cols \
    ${MESHCAST_GPU_BENCH_BYTES:+--max-bytes "$MESHCAST_GPU_BENCH_BYTES"} ||
    fail "gpu_reshard_bench --cols $cols (wrong elements, or an error above)"
done

echo
echo "gpu-check: passed ($(($(date +%s) - t_all)) s)"
