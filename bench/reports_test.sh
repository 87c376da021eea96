#!/usr/bin/env bash
# Every report of bench/report.py's family writes its doc from what its benchmark writes today:
# each benchmark runs in smoke mode with --json into a scratch directory, then its report runs on
# that output (and the cluster one on docs/data/cluster-*.json), with plots when matplotlib is
# installed. A report that no longer reads its benchmark's JSON, or a run with a wrong element,
# fails here rather than on the next hour-long bench/run-*.sh.
# Not here: sync_report (bench/sync_report_test.sh compares docs/sync.md with its data) and
# trainers_report, whose inputs are nine trainings on emulated hosts (bench/run-trainers.sh).
#   bench/reports_test.sh BIN_DIR   (from the repository root)
set -euo pipefail
bin=$(cd "$1" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export MESHCAST_BENCH_SMOKE=1
failed=0

# report NAME ARGS...: bench/NAME_report.py writing $tmp/NAME.md and its plots under $tmp/img.
report() {
  local name=$1
  shift
  if "$python" "bench/${name}_report.py" "$@" --doc "$tmp/$name.md" --img "$tmp/img" \
    --command "bench/reports_test.sh" >"$tmp/$name.log" 2>&1 && [[ -s $tmp/$name.md ]]; then
    echo "ok   $(tail -1 "$tmp/$name.log")"
  else
    echo "FAIL ${name}_report:"
    sed 's/^/  /' "$tmp/$name.log"
    failed=1
  fi
}

mpirun_shm -np 4 "$bin/mpi_reshard" --fit --json "$tmp/mpi.json" >"$tmp/mpi.txt"
report mpi "$tmp/mpi.json"

mpirun_shm -np 4 "$bin/mpi_collectives" --json "$tmp/collectives.json" >"$tmp/collectives.txt"
report collectives "$tmp/collectives.json"

mpirun_shm -np 4 "$bin/mpi_training" --stages dp=1,tp=2/dp=2 --micro-batches 2 --label smoke \
  --json "$tmp/training.json" >"$tmp/training.txt"
report training "$tmp/training.json"

for b in reshard_local planner; do
  "$bin/$b" --benchmark_out="$tmp/$b.json" --benchmark_out_format=json >"$tmp/$b.txt" 2>&1
done
report core --reshard "$tmp/reshard_local.json" --planner "$tmp/planner.json"

"$bin/model" --json "$tmp/study.json" --benchmark_out="$tmp/scale.json" \
  --benchmark_out_format=json >"$tmp/model.txt" 2>&1
report model --cluster docs/data/cluster-*.json --study "$tmp/study.json" --scale "$tmp/scale.json"

report cluster docs/data/cluster-*.json
exit "$failed"
