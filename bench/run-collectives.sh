#!/usr/bin/env bash
# Builds bench/mpi_collectives (Release), runs it in shared memory at 4 and 8 ranks and on the
# emulated cluster (bench/cluster/cluster.sh: 5 hosts x 4 ranks, 1 Gbit/s per host, with
# meshes/emulated.json so that auto goes hierarchical), and writes docs/collectives.md.
#
#   bench/run-collectives.sh        # ~10 minutes on 2 cores
#
# Environment: BUILD_DIR (default build/bench-mpi), ITERS (9; 5 on the cluster), MAX_BYTES
# (64 MiB; 16 MiB on the cluster), JOBS (2), RANKS ("4 8"), CLUSTER (1; 0 skips it, as it does
# where namespaces cannot be made). Exits non-zero if a run failed or any element was wrong.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build/bench-mpi}
results="$build/results-collectives"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DMESHCAST_BUILD_TOOLS=OFF \
  -DMESHCAST_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target mpi_collectives
mkdir -p "$results"
rm -f "$results"/np*.json
status=0
for np in ${RANKS:-4 8}; do
  echo "== $np ranks" >&2
  mpirun --allow-run-as-root --oversubscribe --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 -np "$np" \
    "$build/bin/mpi_collectives" --iters "${ITERS:-9}" --max-bytes "${MAX_BYTES:-67108864}" \
    --json "$results/np$np.json" | tee "$results/np$np.txt" || status=1
done
if [[ ${CLUSTER:-1} != 0 ]] && bench/cluster/cluster.sh check >/dev/null 2>&1; then
  echo "== emulated cluster, 5 hosts x 4 ranks" >&2
  bench/cluster/cluster.sh run --hosts 5 --ranks-per-host 4 -- "$build/bin/mpi_collectives" \
    --topology meshes/emulated.json --iters 5 --max-bytes 16777216 \
    --json "$results/cluster.json" | tee "$results/cluster.txt" || status=1
fi
source bench/python.sh
"$python" bench/collectives_report.py "$results"/*.json --doc docs/collectives.md \
  --command "bench/run-collectives.sh (ITERS=${ITERS:-9})" || status=1
exit "$status"
