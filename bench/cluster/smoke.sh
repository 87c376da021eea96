#!/usr/bin/env bash
# CI's smoke run of the cluster suite: 2 emulated hosts x 2 ranks (one NIC per host, shaped both
# ways, then the n-to-m group with a NIC per device), tiny sizes (MESHCAST_BENCH_SMOKE
# is set by ctest). Exit 77 (ctest: skipped) with the reason when namespaces cannot be made here.
#   bench/cluster/smoke.sh PATH/TO/cluster_suite
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
why=$("$here/cluster.sh" check) || {
  echo "SKIP: $why"
  exit 77
}
# --duplex shapes both ends of each host's link: its net0 and the bridge's end.
"$here/cluster.sh" up --hosts 2 --duplex
shaped=$( (ip netns exec mc-host1 tc qdisc show dev net0; tc qdisc show dev mc-v1) | grep -c tbf)
"$here/cluster.sh" down
[[ $shaped == 2 ]] || { echo "FAIL: --duplex shaped $shaped of host 1's 2 link ends"; exit 1; }
"$here/cluster.sh" run --hosts 2 --ranks-per-host 2 --duplex -- "$1" \
  --topology "$here/../../meshes/emulated-2x2.json" --iters 2 --warmup 0
# And with a NIC per device (each rank in a namespace of its own, sharing its host's memory).
exec "$here/cluster.sh" run --hosts 2 --ranks-per-host 2 --nic-per-rank -- "$1" \
  --topology "$here/../../meshes/emulated-2x2.json" --iters 2 --warmup 0 --groups nm
