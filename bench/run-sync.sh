#!/usr/bin/env bash
# `meshcast sync` measured, every mode in the same run: writes docs/data/sync-*.json, then
# bench/sync_report.py writes docs/sync.md and docs/img/sync-*.png.
#  1. emulated cluster (bench/cluster/cluster.sh: 4 hosts x 2 ranks, 1 Gbit/s per host), a
#     trainer of tp=2 x pp=2 (hosts 0-1) to generators of tp=2 x dp=2 (hosts 2-3): GPT-2 medium
#     (388 tensors, 1.42 GB of f32) and the synthetic 1,028-tensor model (255 MB, mostly norms
#     and biases), each fused, per-tensor, gather, and fused with a bf16 cast; twice: with each
#     host's egress shaped (names emulated*), then with its ingress shaped too (--duplex, names
#     duplex*), which is what the topology file's NICs model; and GPT-2 medium with a NIC per
#     device, shaped both ways (--nic-per-rank --duplex, meshes/emulated-4x2-nic.json, names nic*);
#     and co-located (names colocated*): 2 hosts x 4 ranks with a NIC per device, a trainer of
#     dp=3 on host 0 and generators of dp=5, one on host 0 and four on host 1 (GPT-2 small,
#     models/systems/dp3-to-dp5.json, meshes/emulated-2x4-nic.json), fused with and without
#     forked chains (--no-fork), per-tensor and gather;
#  2. shared memory, 8 ranks (no emulation): the synthetic 1,028-tensor model, mostly norms and
#     biases, then its 642 tensors of at most 64 KiB alone: fused, per-tensor, gather;
#  3. --predict at scale: Qwen3-235B-A22B (64 -> 64) and DeepSeek-V3 (128 -> 128) on the H100
#     cluster and GB200 NVL72 topologies, every mode.
#
#   bench/run-sync.sh                 # ~30 minutes on 2 cores
#   PARTS="predict" bench/run-sync.sh  # only part 3 (seconds)
#
# Environment: BUILD_DIR (build/default), ITERS (3: emulated), SHM_ITERS (5), PARTS ("emulated
# shm predict"), CASES (part 1's NAME:MODEL cases, all by default), PYTHON (an interpreter with
# matplotlib). Part 1 needs root (namespaces).
# Exits non-zero if a run failed or any element was wrong.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build=${BUILD_DIR:-build/default}
parts=${PARTS:-emulated shm predict}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target meshcast_cli
mc=$build/bin/meshcast
mkdir -p docs/data
status=0

# run NAME COMMAND...: the one JSON line of a run into docs/data/sync-NAME.json
run() {
  local name=$1
  shift
  echo "== $name: $*" >&2
  local out
  out=$("$@" | grep '^{') || status=1
  [[ -n $out ]] || { echo "   no result" >&2; status=1; return; }
  printf '%s\n' "$out" >"docs/data/sync-$name.json"
  python3 -c 'import json,sys; o=json.loads(sys.argv[1])
print("   %s: %.3f s (predicted %.3f, link bound %.3f), verified %s" % (o["mode"],
      o.get("seconds", 0), o["predicted_seconds"], o["link_bound_seconds"], o.get("verified")))
if "verified" in o and not o["verified"]: sys.exit(1)' "$out" >&2 || status=1
}

if [[ " $parts " == *" emulated "* ]]; then
  for case in ${CASES:-emulated:gpt2-medium emulated-narrow:gpt2-deep-narrow duplex:gpt2-medium \
      duplex-narrow:gpt2-deep-narrow nic:gpt2-medium colocated:gpt2-small}; do
    name=${case%%:*}
    emu=(bench/cluster/cluster.sh run --hosts 4 --ranks-per-host 2 --rate 1gbit)
    topology=meshes/emulated-4x2.json
    system=models/systems/tp2pp2-to-tp2dp2.json
    [[ $name == duplex* || $name == nic || $name == colocated ]] && emu+=(--duplex)
    if [[ $name == nic ]]; then
      emu+=(--nic-per-rank)
      topology=meshes/emulated-4x2-nic.json
    fi
    if [[ $name == colocated ]]; then
      emu=(bench/cluster/cluster.sh run --hosts 2 --ranks-per-host 4 --rate 1gbit --duplex
           --nic-per-rank)
      topology=meshes/emulated-2x4-nic.json
      system=models/systems/dp3-to-dp5.json
    fi
    emu+=(--)
    args=(--model "models/${case##*:}.json" --system "$system"
          --topology "$topology" --backend mpi --iters "${ITERS:-3}" --verify --json)
    run "$name-fused" "${emu[@]}" "$mc" sync "${args[@]}" --mode fused
    [[ $name == colocated ]] &&
      run "$name-fused-nofork" "${emu[@]}" "$mc" sync "${args[@]}" --mode fused --no-fork
    run "$name-per-tensor" "${emu[@]}" "$mc" sync "${args[@]}" --mode per-tensor
    run "$name-gather" "${emu[@]}" "$mc" sync "${args[@]}" --mode gather
    [[ $name == colocated ]] ||
      run "$name-fused-bf16" "${emu[@]}" "$mc" sync "${args[@]}" --mode fused --cast bf16
  done
fi

if [[ " $parts " == *" shm "* ]]; then
  # The model's tensors of at most 16,384 elements (64 KiB of f32) alone, its norms and biases:
  # what coalescing saves where messages, not bytes, take the time.
  small=$build/gpt2-deep-narrow-small.json
  python3 -c 'import json, math, sys
m = json.load(open(sys.argv[1]))
json.dump({k: v for k, v in m.items() if math.prod(v["shape"]) <= 16384}, sys.stdout)' \
    models/gpt2-deep-narrow.json >"$small"
  for case in shm:models/gpt2-deep-narrow.json "shm-small:$small"; do
    for mode in fused per-tensor gather; do
      run "${case%%:*}-$mode" mpirun_shm -np 8 "$mc" sync --model "${case#*:}" \
        --system models/systems/tp2pp2-to-tp2dp2.json --backend mpi --iters "${SHM_ITERS:-5}" \
        --verify --json --mode "$mode"
    done
  done
fi

if [[ " $parts " == *" predict "* ]]; then
  for model in qwen3-235b-a22b:qwen3-235b deepseek-v3:deepseek-v3; do
    for topo in h100-cluster gb200-nvl72; do
      for mode in fused per-tensor gather; do
        run "predict-${model%%:*}-$topo-$mode" "$mc" sync --model "models/${model%%:*}.json" \
          --system "models/systems/${model##*:}.json" --topology "meshes/$topo.json" \
          --mode "$mode" --predict --json
      done
    done
  done
fi

"$python" bench/sync_report.py docs/data/sync-*.json || status=1
exit $status
