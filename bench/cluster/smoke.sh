#!/usr/bin/env bash
# CI's smoke run of the cluster suite: 2 emulated hosts x 2 ranks (one NIC per host, then the
# n-to-m group with a NIC per device), tiny sizes (MESHCAST_BENCH_SMOKE
# is set by ctest). Exit 77 (ctest: skipped) with the reason when namespaces cannot be made here.
#   bench/cluster/smoke.sh PATH/TO/cluster_suite
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
why=$("$here/cluster.sh" check) || {
  echo "SKIP: $why"
  exit 77
}
"$here/cluster.sh" run --hosts 2 --ranks-per-host 2 -- "$1" \
  --topology "$here/../../meshes/emulated-2x2.json" --iters 2 --warmup 0
# And with a NIC per device (each rank in a namespace of its own, sharing its host's memory).
exec "$here/cluster.sh" run --hosts 2 --ranks-per-host 2 --nic-per-rank -- "$1" \
  --topology "$here/../../meshes/emulated-2x2.json" --iters 2 --warmup 0 --groups nm
