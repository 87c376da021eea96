#!/usr/bin/env bash
# The CLI under mpirun --enable-recovery (survivors keep running when a rank dies): a long
# reshard, one rank killed (SIGKILL) or stopped (SIGSTOP) at a random moment, for a sender, a
# chain member and a receiver, on each process backend. Every survivor must exit on its own,
# printing one line that names the failed device, within a bound: 10 s for a killed rank, the
# configured timeout (MESHCAST_TIMEOUT) plus the liveness check's grace for a stopped one.
# Also: options that differ between ranks are refused on every rank, naming the option.
# Usage: BACKENDS="mpi ucx" fault_matrix.sh MESHCAST MPIEXEC
set -u
cli=$1
run=("$2" --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none)
export MESHCAST_TIMEOUT=5
fail=0
seed=${FAULT_SEED:-$RANDOM}
RANDOM=$seed
echo "seed $seed (FAULT_SEED=$seed reproduces the delays)"
tmp=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT

# The ranks of this script's current job only: each job's carry FAULT_MATRIX_JOB=$tag (other
# tests' meshcast ranks, run alongside, were taken for its victim or its survivors).
ranks_of_job() {
  local p
  for p in $(pgrep -f "$cli reshard"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "FAULT_MATRIX_JOB=$tag" && echo "$p"
  done
}
# pid of the meshcast process of rank R of the job
pid_of_rank() {
  local p
  for p in $(ranks_of_job); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}

# One broadcast chain 0 -> 1 -> 2 -> 3 (device 0 sends, 1 and 2 forward, 3 only receives).
export MESHCAST_MAX_RUN_BYTES=1024T  # runs until a fault ends it
args=(reshard --shape 4096,1024 --dtype f32 --src 1@0:RR --dst 3@1-3:RR --strategy broadcast
      --iters 1000000)
for backend in ${BACKENDS:-mpi}; do
  # Start-up (MPI, the backend's session, planning, filling) as this machine runs it now: a
  # fault during start-up meets the start deadline (60 s), not the bound. Each fault comes
  # after 1.5 times a whole one-iteration job, at least 2 s, plus a random moment.
  t0=$(date +%s.%N)
  "${run[@]}" -np 4 "$cli" "${args[@]:0:11}" --iters 1 --backend "$backend" >/dev/null 2>&1
  settle=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { t = 1.5 * (b - a); printf "%.1f", (t > 2 ? t : 2) }')
  echo "$backend: faults from ${settle} s after the start"
  for sig in KILL STOP; do
    for victim in 0 2 3; do
      name="$backend SIG$sig device $victim"
      tag="$$.$backend.$sig.$victim"
      "${run[@]}" --enable-recovery -x "FAULT_MATRIX_JOB=$tag" -np 4 "$cli" "${args[@]}" \
        --backend "$backend" >"$tmp/out" 2>&1 &
      job=$!
      sleep "$(awk -v s="$settle" -v r="$((RANDOM % 30))" 'BEGIN { print s + r / 10 }')"
      pid=$(pid_of_rank "$job" "$victim")
      if [[ -z $pid ]]; then
        echo "FAIL $name: no process for rank $victim"; fail=1; kill -9 $job; wait $job; continue
      fi
      t0=$(date +%s.%N)
      kill -$sig "$pid"
      bound=$([[ $sig == KILL ]] && echo 10 || echo $((MESHCAST_TIMEOUT + 10)))
      # Survivors print their line and exit; the stopped rank stays until we end it.
      for ((i = 0; i < (bound + 5) * 10; ++i)); do
        n=$(grep -c "^meshcast: device $victim" "$tmp/out")
        [[ $n -ge 3 ]] && break
        sleep 0.1
      done
      # (counted before the stopped rank resumes: it then reads the notice naming itself)
      t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
      kill -CONT "$pid" 2>/dev/null
      for ((i = 0; i < 30; ++i)); do  # each survivor exits right after its line
        survivors=0
        for p in $(ranks_of_job); do
          [[ $p != "$pid" ]] && survivors=$((survivors + 1))
        done
        [[ $survivors -eq 0 ]] && break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null
      timeout 20 tail --pid=$job -f /dev/null || kill -9 $job
      wait $job 2>/dev/null
      if [[ $n -ne 3 ]] || awk -v t="$t" -v b="$bound" 'BEGIN { exit !(t > b) }'; then
        echo "FAIL $name: $n of 3 survivors named device $victim in ${t} s (bound $bound s)"
        grep -v '^\[\|^-\|^ *$' "$tmp/out" | head -8
        fail=1
      elif [[ $survivors -ne 0 ]]; then
        echo "FAIL $name: $survivors survivor(s) still running after naming the failure"; fail=1
      else
        echo "ok   $name: 3 survivors named it within ${t} s; $(grep -m1 "^meshcast: device $victim" "$tmp/out")"
      fi
    done
  done

  # Options that differ on some ranks: refused on every rank, naming the option and the ranks.
  for opt in --verify "--iters 3"; do
    field=${opt#--}
    field=${field%% *}
    out=$(timeout 60 "${run[@]}" --enable-recovery -np 4 bash -c "x=; [[ \$OMPI_COMM_WORLD_RANK == 2 ]] && x='$opt'
      exec $cli ${args[*]:0:11} --backend $backend \$x" 2>&1)
    rc=$?
    n=$(grep -c "^meshcast: $field: rank 2 was started with a different $field" <<<"$out")
    if [[ $rc -eq 124 || $n -ne 4 ]]; then
      echo "FAIL $backend disagreeing $opt: rc=$rc, $n of 4 ranks refused naming rank 2"
      echo "$out" | grep -v '^\[' | head -6
      fail=1
    else
      echo "ok   $backend disagreeing $opt: $(grep -m1 '^meshcast:' <<<"$out")"
    fi
  done
done
exit $fail
