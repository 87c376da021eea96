#!/usr/bin/env bash
# Builds bench/cluster_suite (Release), runs it on the emulated cluster (5 hosts x 4 ranks, one
# 1 Gbit/s link per host: bench/cluster/cluster.sh, meshes/emulated.json), one launch per group,
# and writes docs/benchmarks.md and docs/img/cluster-*.png from the JSON of the runs (kept as
# docs/data/cluster-GROUP.json for bench/run-model.sh).
#
#   bench/run-cluster.sh                       # ~25 minutes on 2 cores
#   ITERS=3 GROUPS_TO_RUN="1m" bench/run-cluster.sh
#
# Environment: BUILD_DIR (default build/bench-mpi), ITERS (5), WARMUP (1), JOBS (2), SIZES_MIB
# (16,64: the 1-to-m sizes), GROUPS_TO_RUN ("1m nm nm-nic 2d"; nm-nic: the n-to-m group with a
# NIC per device, cluster.sh --nic-per-rank and meshes/emulated-nic.json), RATE (1gbit), PYTHON
# (an interpreter with matplotlib). Needs root (network namespaces). The document is written
# from every group's latest run in docs/data, so a run of some groups keeps the others' figures.
# Exits non-zero if a run failed or any element was wrong (the document is written all the same).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_build build/bench-mpi cluster_suite
iters=${ITERS:-5}
warmup=${WARMUP:-1}
groups=${GROUPS_TO_RUN:-1m nm nm-nic 2d}
results="$build/results-cluster"
launch=(bench/cluster/cluster.sh run --hosts 5 --ranks-per-host 4 --rate "${RATE:-1gbit}" --)

rm -rf "$results"
mkdir -p "$results"

status=0
for g in $groups; do
  # nm-nic: the n-to-m group on hosts with a NIC per device (DGX-style) instead of one per host.
  run=("${launch[@]}") topology=meshes/emulated.json suite_group=$g
  if [[ $g == nm-nic ]]; then
    run=("${launch[@]:0:${#launch[@]}-1}" --nic-per-rank --) topology=meshes/emulated-nic.json
    suite_group="nm"
  fi
  echo "== $g: ${run[*]} cluster_suite --groups $suite_group" >&2
  "${run[@]}" "$build/bin/cluster_suite" --topology "$topology" --groups "$suite_group" \
    --iters "$iters" --warmup "$warmup" --sizes-mib "${SIZES_MIB:-16,64}" \
    --json "$results/$g.json" | tee "$results/$g.txt" || status=1
done

# The runs' JSON, kept beside the documents: bench/run-model.sh validates the cost model with them.
mkdir -p docs/data
for f in "$results"/*.json; do cp "$f" "docs/data/cluster-$(basename "$f")"; done

"$python" bench/cluster_report.py docs/data/cluster-*.json --doc docs/benchmarks.md --img docs/img \
  --command "bench/run-cluster.sh (ITERS=$iters)" --launch "${launch[*]}" || status=1
exit "$status"
