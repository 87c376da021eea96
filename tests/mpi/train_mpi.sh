#!/usr/bin/env bash
# `meshcast train gpt --backend mpi` under mpirun: one process per device gives the losses of
# the in-process run (and of the serial one), and only rank 0 prints.
# Usage: train_mpi.sh MESHCAST MPIEXEC
set -u
mc=$1
run=("$2" --allow-run-as-root --oversubscribe --mca btl self,vader)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../support/train_helpers.sh"

common=(--steps 3 --batch 8 --seq 16 --d-model 32 --layers 4 --heads 4 --json --out "$tmp")
serial=$("$mc" train gpt "${common[@]}" | losses)
# "ranks:options"
for case in "4:--stages dp=1,tp=2/dp=2 --micro-batches 2 --schedule eager-1f1b" \
            "4:--stages grid=2x1x2 --micro-batches 1" \
            "4:--stages dp=1,tp=2/dp=1,tp=2 --micro-batches 2 --reshard broadcast" \
            "3:--stages dp=1/dp=1/dp=1 --micro-batches 4 --schedule 1f1b"; do
  np=${case%%:*} args=${case#*:}
  # shellcheck disable=SC2086
  out=$(timeout 300 "${run[@]}" -np "$np" "$mc" train gpt "${common[@]}" $args --backend mpi 2>&1)
  rc=$?
  json_lines=$(printf '%s\n' "$out" | grep -c '^{')
  got=$(printf '%s\n' "$out" | grep '^{' | head -1 | losses 2>/dev/null)
  # shellcheck disable=SC2086
  local_run=$("$mc" train gpt "${common[@]}" $args | losses)
  if [[ $rc -eq 0 && $json_lines -eq 1 ]] && close "$serial" "$got" && close "$local_run" "$got"; then
    ok
  else
    bad "np=$np $args: rc=$rc json-lines=$json_lines mpi [$got] local [$local_run] serial [$serial]"
    printf '%s\n' "$out" | tail -5
  fi
done

# Too few ranks: every rank refuses with exit 2 (no hang).
out=$(timeout 120 "${run[@]}" -np 2 "$mc" train gpt --stages dp=4 --backend mpi --out "$tmp" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *devices* ]] && ok || bad "too few ranks: rc=$rc $out"

echo "train_mpi: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
