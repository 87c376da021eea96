#!/usr/bin/env bash
# Builds bench/mpi_training (Release) and measures the training engine's step-time breakdown,
# overlap on and off, on the emulated cluster (bench/cluster/cluster.sh: 2 hosts x 2 ranks,
# 1 Gbit/s per host), then writes docs/training-engine.md.
#
#   bench/run-training.sh        # ~8 minutes on 2 cores, as root
#
# Environment: BUILD_DIR (default build/bench-mpi), JOBS (2), ROUNDS (2: alternating runs of
# overlap on and off per configuration). Exits non-zero if a run failed.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_build build/bench-mpi mpi_training
results="$build/results-training"
mkdir -p "$results"
rm -f "$results"/*.json
needs_hosts run-training
status=0
common=(--batch 32 --micro-batches 8 --topology meshes/emulated-2x2.json --rounds "${ROUNDS:-2}")
# name | options: pipeline across the hosts with data parallelism inside; Megatron inside a
# host; data parallelism across hosts; a 3D grid whose depth spans the hosts.
while IFS='|' read -r -u 3 name opts; do
  echo "== $name" >&2
  # shellcheck disable=SC2086
  bench/cluster/cluster.sh run --hosts 2 --ranks-per-host 2 -- "$build/bin/mpi_training" \
    "${common[@]}" $opts --label "$name" --json "$results/$name.json" || status=1
done 3<<'CASES'
pp2-dp2-eager|--stages dp=2/dp=2 --schedule eager-1f1b
pp2-dp2-1f1b|--stages dp=2/dp=2 --schedule 1f1b
pp2-dp2-gpipe|--stages dp=2/dp=2 --schedule gpipe
pp2-tp2-eager|--stages dp=1,tp=2/dp=1,tp=2 --schedule eager-1f1b --sub-batches 2
dp4|--stages dp=4 --schedule 1f1b
grid-1x2x2|--stages grid=1x2x2 --schedule 1f1b --sub-batches 2
CASES
"$python" bench/training_report.py "$results"/*.json --doc docs/training-engine.md \
  --command "bench/run-training.sh (ROUNDS=${ROUNDS:-2})" || status=1
exit "$status"
