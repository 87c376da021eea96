#!/usr/bin/env bash
# `meshcast sync` under mpirun, one process per device: the shipped GPT-2-small manifest from a
# trainer of tp=2 x pp=2 (ranks 0-3) to generators of tp=2 x dp=2 (ranks 4-7), every mode and a
# bf16 cast; from a trainer of dp=3 beside a generator, on chains that fork at the root; a
# sync saved by --save-plan run from the file (--plan); on each process backend, every element
# checked (--verify), and --predict reported once. Then the faults, each ended on
# every rank with one line and no rank left waiting: a rank given another model file, another
# option or a bad model file; a model too large for the host's memory; a rank killed mid-sync,
# named by every survivor within 15 s; a rank killed in the job's closing sum, named by the ranks
# still in it (KILL_AFTER_SUM: tests/mpi/kill_after_sum.cc's module).
# Usage: BACKENDS="mpi ucx" sync_mpi.sh MESHCAST MPIEXEC
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mc=$1
run=("$2" --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none)
model=(--model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json)
tmp=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
# refused_on_rank RANK STATUS WANT LABEL: in $out (and $rc) of an 8-rank job whose ranks each
# echo "status N": RANK's input was refused with a line matching WANT, which the 7 others
# report as "rank RANK: WANT", and every rank exited STATUS.
refused_on_rank() {
  local r=$1 status=$2 want=$3 label=$4 n own st
  n=$(grep -c "^meshcast: rank $r: $want" <<<"$out")
  own=$(grep -c "^meshcast: $want" <<<"$out")
  st=$(grep -c "^status $status$" <<<"$out")
  if [[ $rc -ne 124 && $n -eq 7 && $own -eq 1 && $st -eq 8 ]]; then ok
  else bad "$label: rc=$rc, $n+$own of 8 said it, $st exited $status: $out"; fi
}
descendants() {  # PID: its processes, children first
  local p
  for p in $(pgrep -P "$1"); do
    echo "$p"
    descendants "$p"
  done
}
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

for backend in ${BACKENDS:-mpi}; do
  for extra in "--mode fused" "--mode per-tensor" "--mode gather" "--cast bf16 --max-staging-bytes 1M"; do
    # shellcheck disable=SC2086
    out=$(timeout 300 "${run[@]}" -np 8 "$mc" sync "${model[@]}" --backend "$backend" \
          --iters 1 --verify --json $extra 2>&1)
    rc=$?
    got=$(printf '%s\n' "$out" | grep '^{' | python3 -c 'import json,sys
o = json.loads(sys.stdin.readline()); print(o["verified"], o["mismatches"])' 2>/dev/null)
    if [[ $rc -eq 0 && $got == "True 0" ]]; then ok; else bad "$backend $extra: rc=$rc $got $out"; fi
  done

  # Chains that fork at the root: a trainer of dp 3 beside a generator on host 0 of a
  # NIC-per-device topology (its host names are the topology's; the ranks share this machine).
  out=$(timeout 300 "${run[@]}" -np 8 "$mc" sync --model models/gpt2-small.json \
        --system models/systems/dp3-to-dp5.json --topology meshes/emulated-2x4-nic.json \
        --backend "$backend" --iters 1 --verify --json 2>&1)
  rc=$?
  got=$(printf '%s\n' "$out" | grep '^{' | python3 -c 'import json,sys
o = json.loads(sys.stdin.readline()); print(o["verified"], o["mismatches"], o["fork"])' 2>/dev/null)
  if [[ $rc -eq 0 && $got == "True 0 True" ]]; then ok; else bad "$backend forked: rc=$rc $got $out"; fi

  # A sync saved by --save-plan, run by every rank from the file.
  "$mc" sync "${model[@]}" --cast bf16 --mode per-tensor --save-plan "$tmp/saved.json" >/dev/null
  out=$(timeout 300 "${run[@]}" -np 8 "$mc" sync --plan "$tmp/saved.json" --backend "$backend" \
        --iters 1 --verify --json 2>&1)
  rc=$?
  got=$(printf '%s\n' "$out" | grep '^{' | python3 -c 'import json,sys
o = json.loads(sys.stdin.readline()); print(o["verified"], o["mismatches"], o["mode"], o["cast"])' 2>/dev/null)
  if [[ $rc -eq 0 && $got == "True 0 per-tensor bf16" ]]; then ok; else bad "$backend --plan: rc=$rc $got $out"; fi

  # Rank 6 reads another model: every rank refuses, naming the setting, before moving anything.
  cp models/gpt2-small.json "$tmp/other.json"
  sed -i '0,/"F32"/s//"BF16"/' "$tmp/other.json"
  out=$(timeout 60 "${run[@]}" --enable-recovery -np 8 bash -c "m=models/gpt2-small.json
    [[ \$OMPI_COMM_WORLD_RANK == 6 ]] && m=$tmp/other.json
    exec $mc sync --model \$m --system models/systems/tp2pp2-to-tp2dp2.json --backend $backend" 2>&1)
  rc=$?
  n=$(grep -c "^meshcast: model: rank 6 was started with a different model" <<<"$out")
  if [[ $rc -ne 124 && $n -eq 8 ]]; then ok; else bad "$backend other model: rc=$rc, $n of 8 refused: $out"; fi

  # Rank 6's model file is bad: it says why and the 7 others say it for it, all exit 2, no
  # rank waits for it (--enable-recovery: the job is not ended at the first failed rank, as
  # srun's default does not end it).
  sed '0,/"F32"/s//"F33"/' models/gpt2-small.json >"$tmp/bad.json"
  out=$(timeout 60 "${run[@]}" --enable-recovery -np 8 bash -c "m=models/gpt2-small.json
    [[ \$OMPI_COMM_WORLD_RANK == 6 ]] && m=$tmp/bad.json
    $mc sync --model \$m --system models/systems/tp2pp2-to-tp2dp2.json --backend $backend
    echo status \$?" 2>&1)
  rc=$?
  refused_on_rank 6 2 "tensors\..*\.dtype: unknown dtype 'F33'" "$backend bad model on rank 6"

  # Options every rank must share, each given otherwise to rank 3 alone: refused on every rank,
  # naming the option.
  for opt in "--strategy sendrecv" "--max-staging-bytes 1M" "--predict"; do
    name=${opt%% *}
    out=$(timeout 60 "${run[@]}" --enable-recovery -np 8 bash -c "o=''
      [[ \$OMPI_COMM_WORLD_RANK == 3 ]] && o='$opt'
      exec $mc sync ${model[*]} --backend $backend --iters 1 \$o" 2>&1)
    rc=$?
    n=$(grep -c "^meshcast: ${name#--}: rank 3 was started with a different" <<<"$out")
    if [[ $rc -ne 124 && $n -eq 8 ]]; then ok; else bad "$backend $opt on rank 3: rc=$rc, $n of 8 refused: $out"; fi
  done

  # --predict on every rank: one report, from rank 0.
  out=$(timeout 60 "${run[@]}" -np 8 "$mc" sync "${model[@]}" --backend "$backend" --predict \
        --json 2>&1)
  rc=$?
  n=$(grep -c '^{' <<<"$out")
  if [[ $rc -eq 0 && $n -eq 1 ]]; then ok; else bad "$backend --predict: rc=$rc, $n reports: $out"; fi

  # A sync whose whole plan is over one process's planning bound, each rank's part within it:
  # it runs and verifies, its report not priced (rank 0 refused it at the report, after the run).
  out=$(timeout 120 "${run[@]}" -np 8 -x MESHCAST_MAX_PLAN_MEMORY_BYTES=30M "$mc" sync "${model[@]}" \
        --backend "$backend" --iters 1 --verify --json 2>&1)
  rc=$?
  got=$(python3 -c 'import json, sys
j = json.loads([l for l in sys.stdin.read().splitlines() if l.startswith("{")][0])
print(j["verified"], j["predicted_seconds"], j["unpriced"].startswith("plan memory: "))' <<<"$out" 2>&1)
  if [[ $rc -eq 0 && $got == "True None True" ]]; then ok; else bad "$backend unpriced run: rc=$rc $got: $out"; fi

  # Fewer ranks than the meshes' devices: every rank says how many mpirun must start (rank 0
  # finds it, the others hear it from rank 0).
  echo '{"w": {"shape": [64], "dtype": "F32", "src": "4@0-3:S0", "dst": "4@4-7:R"}}' >"$tmp/eight.json"
  out=$(timeout 60 "${run[@]}" --enable-recovery -np 4 bash -c \
        "$mc sync --model $tmp/eight.json --backend $backend; echo status \$?" 2>&1)
  rc=$?
  n=$(grep -c "^meshcast: \(rank 0: \)\?backend: the model's meshes use device ids up to 7, so mpirun must start at least 8 ranks (it started 4)$" <<<"$out")
  st=$(grep -c "^status 2$" <<<"$out")
  if [[ $rc -ne 124 && $n -eq 4 && $st -eq 4 ]]; then ok
  else bad "$backend on 4 ranks of 8: rc=$rc, $n of 4 said it, $st exited 2: $out"; fi

  # What rank 0 alone does (save, predict) fails on every rank: the others wait for its
  # outcome instead of leaving it, and wait on none that has ended.
  for opt in "--save-plan $tmp/missing/saved.json|4|save-plan: cannot write" \
    "--predict|2|plan ops: .* exceeds the limit of 300"; do
    IFS='|' read -r args want what <<<"$opt"
    out=$(timeout 60 "${run[@]}" --enable-recovery -np 8 -x MESHCAST_MAX_PLAN_OPS=300 bash -c \
      "$mc sync ${model[*]} --backend $backend $args; echo status \$?" 2>&1)
    rc=$?
    refused_on_rank 0 "$want" "$what" "$backend $args failing on rank 0"
  done

  # A rank of other planning bounds would plan another sync (auto leaves out strategies past
  # them, parts are split to fit them): refused on every rank, exit 2, naming the variable. It
  # went as far as the messages, where the ranks' signatures differed.
  for var in MESHCAST_MAX_PLAN_OPS=10 MESHCAST_MAX_PLAN_MEMORY_BYTES=16414K; do
    out=$(timeout 60 "${run[@]}" --enable-recovery -np 8 bash -c \
      "[[ \$OMPI_COMM_WORLD_RANK == 6 ]] && export $var; \
       $mc sync ${model[*]} --backend $backend --iters 1; echo status \$?" 2>&1)
    rc=$?
    n=$(grep -c "^meshcast: ${var%%=*}: rank 6 was started with a different ${var%%=*} than the 7 others" <<<"$out")
    st=$(grep -c "^status 2$" <<<"$out")
    if [[ $rc -ne 124 && $n -eq 8 && $st -eq 8 ]]; then ok
    else bad "$backend rank 6 with $var: rc=$rc, $n of 8 said it, $st exited 2: $out"; fi
  done

  # A rank's tiles over its own MESHCAST_MAX_BUFFER_BYTES (the others' bound higher): refused on
  # every rank, exit 2 (the others found it dead, exit 3).
  out=$(timeout 60 "${run[@]}" --enable-recovery -np 8 bash -c \
    "[[ \$OMPI_COMM_WORLD_RANK == 3 ]] && export MESHCAST_MAX_BUFFER_BYTES=100; \
     $mc sync ${model[*]} --backend $backend --iters 1; echo status \$?" 2>&1)
  rc=$?
  refused_on_rank 3 2 "buffer bytes: .* exceeds the limit of 100 " "$backend rank 3 over its buffer bound"

  # A system places T + G ranks, whether or not its last generator stage takes a tensor (a model
  # of one tensor, of the first stage only, was checked against the highest id it used).
  echo '{"foo.weight": {"shape": [64, 64], "dtype": "F32"}}' >"$tmp/onlyfirst.json"
  echo '{"train": {"num_gpus": 2, "tp_size": 2}, "generation": {"num_gpus": 2, "pp_size": 2}}' >"$tmp/sys22.json"
  for np in 4 3; do
    out=$(timeout 60 "${run[@]}" --enable-recovery -np $np bash -c "$mc sync --model $tmp/onlyfirst.json \
      --system $tmp/sys22.json --backend $backend --iters 1 --verify >/dev/null; echo status \$?" 2>&1)
    rc=$?
    want=$([[ $np == 4 ]] && echo 0 || echo 2)
    st=$(grep -c "^status $want$" <<<"$out")
    if [[ $rc -ne 124 && $st -eq $np ]] &&
      { [[ $np == 4 ]] || grep -q "system: places 4 devices (trainers and generators), but 3 ranks started" <<<"$out"; }
    then ok; else bad "$backend a first-stage model on $np ranks of a 4-device system: rc=$rc, $st exited $want: $out"; fi
  done

  # A model whose tiles fit each rank's limit but not the 8 ranks of this host together (or,
  # on a machine of over 200 GiB, not one rank's): refused on every rank before any is
  # allocated, exit 2.
  echo '{"a.weight": {"shape": [50000000000], "dtype": "F32"}}' >"$tmp/huge.json"
  out=$(timeout 60 "${run[@]}" --enable-recovery -np 8 bash -c "$mc sync --model $tmp/huge.json \
    --system models/systems/tp2pp2-to-tp2dp2.json --backend $backend --verify; echo status \$?" 2>&1)
  rc=$?
  n=$(grep -cE "^meshcast: (rank 0: )?(model: the 8 ranks on host .* need|buffer bytes: .* exceeds)" <<<"$out")
  twos=$(grep -c "^status 2$" <<<"$out")
  if [[ $rc -ne 124 && $n -eq 8 && $twos -eq 8 ]]; then ok; else bad "$backend huge: rc=$rc, $n of 8 refused: $out"; fi

  # A generator killed mid-sync: the 7 survivors name it and exit within the timeout (5 s) plus
  # the liveness check's grace (a dead process is usually named within a second).
  MESHCAST_MAX_RUN_BYTES=1024T MESHCAST_TIMEOUT=5 "${run[@]}" --enable-recovery -np 8 "$mc" sync "${model[@]}" \
    --backend "$backend" --iters 100000 >"$tmp/out" 2>&1 &
  job=$!
  sleep 8  # past start-up (reading, planning, filling), inside the timed syncs
  # Rank 5 of this job: among mpirun's descendants only (another job's rank 5 may run beside).
  victim=""
  for p in $(descendants "$job"); do
    if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$mc sync" &&
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=5"; then
      victim=$p
    fi
  done
  if [[ -z $victim ]]; then
    bad "$backend kill: no process for rank 5"
  else
    kill -9 "$victim"
    for ((i = 0; i < 150; ++i)); do
      n=$(grep -c "^meshcast: device 5" "$tmp/out")
      [[ $n -ge 7 ]] && break
      sleep 0.1
    done
    if [[ $n -ge 7 ]]; then ok; else bad "$backend kill: $n of 7 survivors named device 5 in 15 s: $(head -5 "$tmp/out")"; fi
  fi
  timeout 20 tail --pid=$job -f /dev/null || kill -9 $job
  wait $job 2>/dev/null

  # A trainer killed inside the job's closing sum, its syncs done (tests/mpi/kill_after_sum.cc):
  # the ranks still in that sum name it and exit 3, those through it exit 0. Under ucx they named
  # device 0 instead, which had ended normally (its run reported a success) before they looked.
  if [[ -n ${KILL_AFTER_SUM:-} ]]; then
    out=$(timeout 120 "${run[@]}" --enable-recovery -np 8 -x MESHCAST_TIMEOUT=5 \
          -x MESHCAST_TEST_KILL_RANK=1 bash -c "LD_PRELOAD=$KILL_AFTER_SUM $mc sync ${model[*]} \
          --backend $backend --iters 1 >/dev/null; echo status \$?" 2>&1)
    rc=$?
    named=$(grep -c "^meshcast: device 1: " <<<"$out")
    other=$(grep "^meshcast: device " <<<"$out" | grep -vc "^meshcast: device 1: ")
    threes=$(grep -c "^status 3$" <<<"$out")
    if [[ $rc -ne 124 && $other -eq 0 && $named -ge 1 && $named -eq $threes ]]; then ok
    else bad "$backend killed in the closing sum: rc=$rc, $named named device 1, $other another, $threes exited 3: $out"; fi
  fi
done

# Ranks started on different backends: every rank says so before either starts (a ucx rank's
# worker address met an mpi rank's first check: a garbled line, exit 1 and 3).
if [[ " ${BACKENDS:-mpi} " == *" ucx "* ]]; then
  one=(sync "${model[@]}" --iters 1)
  out=$(timeout 60 "${run[@]}" --enable-recovery -np 7 bash -c "$mc ${one[*]} --backend mpi; echo status \$?" \
        : -np 1 bash -c "$mc ${one[*]} --backend ucx; echo status \$?" 2>&1)
  rc=$?
  n=$(grep -c "^meshcast: \(rank 0: \)\?backend: rank 7 was started with a different backend than the 7 others" <<<"$out")
  st=$(grep -c "^status 2$" <<<"$out")
  if [[ $rc -ne 124 && $n -eq 8 && $st -eq 8 ]]; then ok
  else bad "mpi and ucx ranks: rc=$rc, $n of 8 said it, $st exited 2: $out"; fi
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
