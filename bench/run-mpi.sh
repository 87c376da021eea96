#!/usr/bin/env bash
# Builds bench/mpi_reshard (Release), runs it under mpirun at the rank counts its cases need, and
# writes docs/benchmarks-mpi.md and docs/img/mpi-*.png from the JSON of the runs.
#
#   bench/run-mpi.sh                 # 5 timed iterations per case, ~10 minutes on 2 cores
#   ITERS=9 bench/run-mpi.sh         # more iterations
#   GROUPS_TO_RUN="a b" bench/run-mpi.sh   # a subset (the document then shows only those)
#
# Runs (one mpirun each, so that no rank idles through a case that does not use it):
#   -np 2 --groups a      contiguous point-to-point vs MPI_Send/MPI_Recv
#   -np 8 --groups b      1 -> r receivers, r = 1..7: chain (4 chunk sizes) and MPI_Ibcast vs one send
#   -np 4 --groups c,d    n-to-m at 4 ranks vs MPI_Alltoallv and all-gather-then-slice; 2-D vs ScaLAPACK
#   -np 8 --groups c      n-to-m at 8 ranks (disjoint 2x2 meshes, a 2x4 mesh)
# Environment: BUILD_DIR (default build/bench-mpi), ITERS (5), WARMUP (1), JOBS (2), MPIRUN
# (mpirun), MPI_ARGS (default: shared memory with single-copy off, which measured faster here),
# GROUPS_TO_RUN (a b c d), PYTHON (an interpreter with matplotlib). Exits non-zero if a run
# failed or any element was wrong (the document is written all the same).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_build build/bench-mpi mpi_reshard
iters=${ITERS:-5}
warmup=${WARMUP:-1}
groups=${GROUPS_TO_RUN:-a b c d}
results="$build/results-mpi"

rm -rf "$results"
mkdir -p "$results"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
read -r -a mpi_args <<<"${MPI_ARGS:---oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none}"
mpirun=(${MPIRUN:-mpirun} "${mpi_args[@]}")

status=0
run() {  # run NP GROUPS NAME
  local np=$1 sel=$2 name=$3
  echo "== $name: mpirun -np $np mpi_reshard --groups $sel --iters $iters --warmup $warmup" >&2
  "${mpirun[@]}" -np "$np" "$build/bin/mpi_reshard" --groups "$sel" --iters "$iters" \
    --warmup "$warmup" --json "$results/$name.json" | tee "$results/$name.txt" || status=1
}
has() { [[ " $groups " == *" $1 "* ]]; }
has a && run 2 a np2-a
has b && run 8 b np8-b
if has c && has d; then run 4 c,d np4-cd; elif has c; then run 4 c np4-c; elif has d; then run 4 d np4-d; fi
has c && run 8 c np8-c

"$python" bench/mpi_report.py "$results"/*.json --doc docs/benchmarks-mpi.md --img docs/img \
  --command "bench/run-mpi.sh (ITERS=$iters)" --mpirun "${mpirun[*]}" || status=1
exit "$status"
