#!/usr/bin/env bash
# Builds bench/mpi_collectives (Release), runs it in shared memory at 4 and 8 ranks and on the
# emulated cluster (bench/cluster/cluster.sh: 5 hosts x 4 ranks, 1 Gbit/s per host, with
# meshes/emulated.json so that auto goes hierarchical; the sparse test again on a 64 MiB table;
# then 2 hosts x 1 rank for the overlap with a core per rank), and writes docs/collectives.md.
#
#   bench/run-collectives.sh        # ~25 minutes on 2 cores
#
# Environment: BUILD_DIR (default build/bench-mpi), RUNS (5 launches of each placement),
# ITERS (9; 5 on the cluster), MAX_BYTES (64 MiB; 16 MiB on the cluster), JOBS (2), RANKS
# ("4 8"), CLUSTER (1; 0 skips it, as it does where namespaces cannot be made). Exits non-zero
# if a run failed or any element was wrong.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_build build/bench-mpi mpi_collectives
results="$build/results-collectives"
mkdir -p "$results"
rm -f "$results"/*.json
status=0
# Each placement RUNS times (launches), alternating: the report takes medians over them.
for run in $(seq 1 "${RUNS:-5}"); do
  for np in ${RANKS:-4 8}; do
    echo "== $np ranks, run $run" >&2
    mpirun_shm -np "$np" "$build/bin/mpi_collectives" --iters "${ITERS:-9}" \
      --max-bytes "${MAX_BYTES:-67108864}" --json "$results/np$np-$run.json" | tee "$results/np$np-$run.txt" || status=1
  done
  if [[ ${CLUSTER:-1} != 0 ]] && bench/cluster/cluster.sh check >/dev/null 2>&1; then
    echo "== emulated cluster, 5 hosts x 4 ranks, run $run" >&2
    bench/cluster/cluster.sh run --hosts 5 --ranks-per-host 4 -- "$build/bin/mpi_collectives" \
      --topology meshes/emulated.json --iters 5 --max-bytes 16777216 \
      --json "$results/cluster-$run.json" | tee "$results/cluster-$run.txt" || status=1
    # Sparse at 0.1% on a 64 MiB table (1,048 rows per member): where the bytes that the
    # balanced scheme saves start to outweigh its extra rounds (16 MiB above: 262 rows).
    echo "== emulated cluster, 5 hosts x 4 ranks, sparse on a 64 MiB table, run $run" >&2
    bench/cluster/cluster.sh run --hosts 5 --ranks-per-host 4 -- "$build/bin/mpi_collectives" \
      --topology meshes/emulated.json --iters 5 --ops sparse --sparse-rows 1048576 \
      --sparse-densities 0.001 --where "20 ranks on the emulated cluster (5 hosts × 4, 1 Gbit/s per host), a 64 MiB table" \
      --json "$results/sparse64-$run.json" | tee "$results/sparse64-$run.txt" || status=1
    # The overlap again where each rank has a core of its own (above, 20 ranks share 2 cores).
    echo "== emulated cluster, 2 hosts x 1 rank, run $run" >&2
    bench/cluster/cluster.sh run --hosts 2 --ranks-per-host 1 -- "$build/bin/mpi_collectives" \
      --iters 5 --min-bytes 16777216 --max-bytes 16777216 --ops all_reduce,overlap \
      --where "2 ranks on 2 emulated hosts (1 Gbit/s, a core each)" \
      --json "$results/overlap-2x1-$run.json" | tee "$results/overlap-2x1-$run.txt" || status=1
  fi
done
"$python" bench/collectives_report.py "$results"/*.json --doc docs/collectives.md \
  --command "bench/run-collectives.sh (RUNS=${RUNS:-5}, ITERS=${ITERS:-9})" || status=1
exit "$status"
