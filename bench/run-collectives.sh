#!/usr/bin/env bash
# Builds bench/mpi_collectives (Release), runs it in shared memory at 4 and 8 ranks, and writes
# docs/collectives.md from the JSON of the runs.
#
#   bench/run-collectives.sh        # ~5 minutes on 2 cores
#
# Environment: BUILD_DIR (default build/bench-mpi), ITERS (9), MAX_BYTES (64 MiB), JOBS (2),
# RANKS ("4 8"). Exits non-zero if a run failed or any element was wrong.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build/bench-mpi}
results="$build/results-collectives"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DMESHCAST_BUILD_TOOLS=OFF \
  -DMESHCAST_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target mpi_collectives
rm -rf "$results"
mkdir -p "$results"
status=0
for np in ${RANKS:-4 8}; do
  echo "== $np ranks" >&2
  mpirun --allow-run-as-root --oversubscribe --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 -np "$np" \
    "$build/bin/mpi_collectives" --iters "${ITERS:-9}" --max-bytes "${MAX_BYTES:-67108864}" \
    --json "$results/np$np.json" | tee "$results/np$np.txt" || status=1
done
python3 bench/collectives_report.py "$results"/np*.json --doc docs/collectives.md \
  --command "bench/run-collectives.sh (ITERS=${ITERS:-9})" || status=1
exit "$status"
