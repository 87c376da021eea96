#!/usr/bin/env bash
# Builds bench/model (Release), runs the study and the scale benchmarks, and writes docs/model.md
# and docs/img/model-*.png from them and from the emulated cluster's measurements
# (docs/data/cluster-*.json, which bench/run-cluster.sh writes).
#
#   bench/run-model.sh          # ~1 minute on 2 cores; the cluster data are not re-measured
#
# Environment: BUILD_DIR (default build/bench-core), REPETITIONS (3: of each scale benchmark),
# JOBS (2), PYTHON (an interpreter with matplotlib).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_build build/bench-core model
results="$build/results"

mkdir -p "$results"
shopt -s nullglob
cluster=(docs/data/cluster-*.json)
[[ ${#cluster[@]} -gt 0 ]] || { echo "run-model.sh: no docs/data/cluster-*.json: run bench/run-cluster.sh first" >&2; exit 1; }

"$build/bin/model" --json "$results/model-study.json" \
  --benchmark_repetitions="${REPETITIONS:-3}" --benchmark_report_aggregates_only=false \
  --benchmark_out="$results/model-scale.json" --benchmark_out_format=json \
  --benchmark_color=false | tee "$results/model.txt"

"$python" bench/model_report.py --cluster "${cluster[@]}" --study "$results/model-study.json" \
  --scale "$results/model-scale.json" --doc docs/model.md --img docs/img \
  --command "bench/run-model.sh"
