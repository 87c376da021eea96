#!/usr/bin/env bash
# The MPI bench programs under mpirun refuse what they cannot run before any work, on every
# rank, with one line from rank 0 and its exit status: ranks given other options (they trained
# other models side by side: a silent result, a hang or a read past a buffer), a --json file
# that cannot be written (found only after the work), a topology that cannot be read (an abort).
#   bench/mpi_faults_test.sh BIN_DIR MPIEXEC
set -uo pipefail
bin=${1:?usage: mpi_faults_test.sh BIN_DIR MPIEXEC}
run=("${2:?}" --allow-run-as-root --oversubscribe --mca btl self,vader)
fails=0 checked=0

# expect STATUS PATTERN COMMAND...: exits STATUS, its output holds PATTERN.
expect() {
  local want=$1 pattern=$2 out rc
  shift 2
  out=$(MESHCAST_BENCH_SMOKE=1 timeout 120 "$@" 2>&1)
  rc=$?
  checked=$((checked + 1))
  if [[ $rc != "$want" ]] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: $*: exit $rc (want $want), output: $(head -5 <<<"$out")"
    fails=$((fails + 1))
  fi
}

if [[ -x $bin/mpi_training ]]; then
  small=(--stages dp=2 --d-model 16 --seq 8 --heads 2 --layers 2 --batch 8 --rounds 1 --steps 2)
  expect 2 "^mpi_training: arguments: the ranks were given other options" \
    "${run[@]}" -np 1 "$bin/mpi_training" "${small[@]}" --micro-batches 1 : \
    -np 1 "$bin/mpi_training" "${small[@]}" --micro-batches 2
  expect 2 "^mpi_training: arguments: the ranks were given other options" \
    "${run[@]}" -np 1 "$bin/mpi_training" "${small[@]}" --d-model 32 : \
    -np 1 "$bin/mpi_training" "${small[@]}"
  # Compared before the checks that differ with them: one rank's --micro-batches 3 does not
  # divide the batch, and that rank alone returned while the other waited.
  expect 2 "^mpi_training: arguments: the ranks were given other options" \
    "${run[@]}" -np 1 "$bin/mpi_training" "${small[@]}" --micro-batches 3 : \
    -np 1 "$bin/mpi_training" "${small[@]}"
  expect 4 "^mpi_training: json: cannot write /nonexistent/x.json" \
    "${run[@]}" -np 2 "$bin/mpi_training" "${small[@]}" --json /nonexistent/x.json
fi
if [[ -x $bin/mpi_collectives ]]; then
  expect 2 "^mpi_collectives: topology: " "${run[@]}" -np 2 "$bin/mpi_collectives" \
    --topology no-such-topology --ops all_reduce --max-bytes 64
fi

echo "$checked checks, $fails failed"
((fails == 0))
