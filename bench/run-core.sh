#!/usr/bin/env bash
# Builds the core benchmarks (Release), runs them with repetitions, and writes
# docs/benchmarks-core.md and docs/img/{reshard-local-*,planner-time}.png from their JSON.
#
#   bench/run-core.sh                     # 5 repetitions of each benchmark, ~8-11 minutes on 2 cores
#   REPETITIONS=7 bench/run-core.sh       # more repetitions
#   FILTER_RESHARD='1x1' FILTER_PLANNER='S0S1' bench/run-core.sh   # a subset
#
# Environment: BUILD_DIR (default build/bench-core), REPETITIONS (5), MIN_TIME_RESHARD (0.3 s of
# timed reshards per repetition), MIN_TIME_PLANNER (0.2 s), FILTER_RESHARD / FILTER_PLANNER
# (Google Benchmark filters), JOBS (2), PYTHON (an interpreter with matplotlib). Repetitions run
# randomly interleaved so that slow drifts of a shared machine spread over every case. Exits
# non-zero if a benchmark failed, a reshard delivered a wrong element or a plan was not
# deterministic (the documents are written all the same).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_build build/bench-core reshard_local planner
reps=${REPETITIONS:-5}
results="$build/results"

mkdir -p "$results"

status=0
run() {  # run NAME MIN_TIME FILTER
  local name=$1 min_time=$2 filter=$3
  echo "== $name: $reps repetitions, min time $min_time s, filter '${filter:-all}'" >&2
  "$build/bin/$name" --benchmark_repetitions="$reps" --benchmark_min_time="$min_time" \
    --benchmark_enable_random_interleaving=true --benchmark_filter="${filter:-.}" \
    --benchmark_out="$results/$name.json" --benchmark_out_format=json \
    --benchmark_color=false | tee "$results/$name.txt" || status=1
}
run reshard_local "${MIN_TIME_RESHARD:-0.3}" "${FILTER_RESHARD:-}"
run planner "${MIN_TIME_PLANNER:-0.2}" "${FILTER_PLANNER:-}"

"$python" bench/core_report.py --reshard "$results/reshard_local.json" --planner "$results/planner.json" \
  --doc docs/benchmarks-core.md --img docs/img \
  --command "bench/run-core.sh (REPETITIONS=$reps)" || status=1
exit "$status"
