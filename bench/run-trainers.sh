#!/usr/bin/env bash
# The trainers on the emulated cluster (bench/cluster/cluster.sh, 1 Gbit/s per host), each pair
# of runs alternated ROUNDS times, then docs/training.md:
#   - U-Transformer, one pipeline stage per host (4 hosts): eager 1F1B vs 1F1B throughput, and
#     the same stages in shared memory (no network: the most hiding transfers could gain);
#   - GPT, two stages of tp=2 on 2 hosts x 2: broadcast vs send/recv stage-boundary reshards;
#   - GPT on 4 devices (2 hosts x 2): 3D tensor parallelism vs Megatron;
#   - GPT: a run checkpointed on one mesh and resumed on another vs an uninterrupted one.
#
#   bench/run-trainers.sh        # ~15 minutes on 2 cores, as root
#
# Environment: BUILD_DIR (default build/default: needs meshcast built with MPI), ROUNDS (2),
# STEPS (12). Exits non-zero if a run failed.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build=${BUILD_DIR:-build/default}
mc=$root/$build/bin/meshcast
results=$build/results-trainers
rm -rf "$results"
mkdir -p "$results"
needs_hosts run-trainers
rounds=${ROUNDS:-2}
steps=${STEPS:-12}

# run NAME HOSTS RANKS_PER_HOST TOPOLOGY MODEL OPTIONS...
run() {
  local name=$1 hosts=$2 rph=$3 topo=$4 model=$5
  shift 5
  echo "== $name" >&2
  bench/cluster/cluster.sh run --hosts "$hosts" --ranks-per-host "$rph" -- "$mc" train "$model" \
    --backend mpi --topology "$topo" --json --out "$results/out-$name" --eval-every 4 "$@" \
    >"$results/$name.json" </dev/null
}

# The same 4 U-Transformer stages on one host (shared memory, same plans): the same processes
# and cores with no network in the way, the floor that hiding transfers can bring a step to.
shm() {
  local name=$1
  shift
  echo "== $name" >&2
  mpirun_shm -np 4 "$mc" train utransformer --backend mpi --topology meshes/emulated-4x1.json --json \
    --out "$results/out-$name" --eval-every 4 "$@" >"$results/$name.json" </dev/null
}

unet=(--layers 8 --seq 64 --d-model 128 --heads 4 --batch 16 --micro-batches 8 --steps "$steps"
      --stages dp=1/dp=1/dp=1/dp=1)
gpt_pp=(--layers 4 --seq 64 --d-model 256 --heads 8 --batch 16 --micro-batches 4 --steps "$steps"
        --stages dp=1,tp=2/dp=1,tp=2 --schedule eager-1f1b)
gpt_tp=(--layers 4 --seq 64 --d-model 256 --heads 8 --batch 16 --micro-batches 1 --steps "$steps")
for r in $(seq 1 "$rounds"); do
  run "unet-eager-$r" 4 1 meshes/emulated-4x1.json utransformer "${unet[@]}" --schedule eager-1f1b
  run "unet-1f1b-$r" 4 1 meshes/emulated-4x1.json utransformer "${unet[@]}" --schedule 1f1b
  shm "unet-shm-eager-$r" "${unet[@]}" --schedule eager-1f1b
  shm "unet-shm-1f1b-$r" "${unet[@]}" --schedule 1f1b
  run "gpt-broadcast-$r" 2 2 meshes/emulated-2x2.json gpt "${gpt_pp[@]}" --reshard broadcast
  run "gpt-sendrecv-$r" 2 2 meshes/emulated-2x2.json gpt "${gpt_pp[@]}" --reshard sendrecv
  run "gpt-3d-$r" 2 2 meshes/emulated-2x2.json gpt "${gpt_tp[@]}" --stages grid=2x2x1
  run "gpt-3d-depth-$r" 2 2 meshes/emulated-2x2.json gpt "${gpt_tp[@]}" --stages grid=1x2x2
  run "gpt-megatron-$r" 2 2 meshes/emulated-2x2.json gpt "${gpt_tp[@]}" --stages tp=4
done
# Resume on another mesh: 40 steps on dp=2,tp=2; 20 on dp=2,tp=2 then 20 more on grid=1x2x2.
resume=(--layers 4 --seq 64 --d-model 64 --heads 4 --batch 16 --eval-every 5)
"$mc" train gpt "${resume[@]}" --steps 40 --stages dp=2,tp=2 --json --out "$results/out-full" \
  >"$results/resume-full.json"
"$mc" train gpt "${resume[@]}" --stages dp=2,tp=2 --steps 20 --checkpoint-dir "$results/ck" \
  --json --out "$results/out-first" >"$results/resume-first.json"
"$mc" train gpt "${resume[@]}" --steps 40 --stages grid=1x2x2 --checkpoint-dir "$results/ck" --resume \
  --json --out "$results/out-second" >"$results/resume-second.json"
# One trainer's own pictures for the docs.
mkdir -p docs/img
cp "$results/out-unet-eager-1/utransformer-steps.png" docs/img/utransformer-steps.png
"$mc" train utransformer --steps 200 --stages dp=1/dp=1 --micro-batches 4 \
  --schedule eager-1f1b --json --out "$results/out-unet200" >"$results/unet200.json"
cp "$results/out-unet200/utransformer-loss.png" docs/img/utransformer-loss.png
"$mc" train gpt --steps 300 --json --out "$results/out-gpt300" >"$results/gpt300.json"
cp "$results/out-gpt300/gpt-loss.png" docs/img/gpt-loss.png
"$python" bench/trainers_report.py "$results" --doc docs/training.md \
  --command "bench/run-trainers.sh (ROUNDS=$rounds, STEPS=$steps)"
