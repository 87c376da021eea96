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

# Too few ranks, or too many (one would sit idle): every rank refuses with exit 2 (no hang).
for np in 2 6; do
  out=$(timeout 120 "${run[@]}" -np $np "$mc" train gpt --stages dp=4 --backend mpi --out "$tmp" 2>&1)
  rc=$?
  [[ $rc -eq 2 && $out == *"must start exactly 4 ranks (it started $np)"* ]] && ok ||
    bad "$np ranks for 4 devices: rc=$rc $out"
done

# A --checkpoint-dir that is not shared (a relative path from another directory on each rank,
# as node-local scratch would be): every rank refuses before training, exit 2, nothing saved.
mkdir -p "$tmp/r0" "$tmp/r1"
# shellcheck disable=SC2016
out=$(timeout 120 "${run[@]}" -np 2 bash -c 'cd "$1/r$OMPI_COMM_WORLD_RANK" && exec "$2" train gpt \
  --steps 2 --batch 8 --seq 16 --d-model 32 --layers 2 --stages dp=2 --backend mpi \
  --checkpoint-dir ck --out o' _ "$tmp" "$(realpath "$mc")" 2>&1)
rc=$?
n=$(printf '%s\n' "$out" | grep -c "checkpoint-dir: ck is not the directory rank 0 locked on rank 1")
[[ $rc -eq 2 && $n -eq 2 && ! -e $tmp/r0/ck/step-00000002 ]] && ok || bad "unshared --checkpoint-dir: rc=$rc n=$n $out"
# Shared: it trains and saves.
out=$(timeout 120 "${run[@]}" -np 2 "$mc" train gpt --steps 2 --batch 8 --seq 16 --d-model 32 \
  --layers 2 --stages dp=2 --backend mpi --checkpoint-dir "$tmp/shared" --out "$tmp" 2>&1)
rc=$?
[[ $rc -eq 0 && -d $tmp/shared/step-00000002 ]] && ok || bad "shared --checkpoint-dir: rc=$rc $out"

# Rank 2's option is bad: it says why and the 3 others say it for it, all exit 2, no rank waits
# for it (--enable-recovery: the job is not ended at its first failed rank, as srun's default
# does not end it).
small=(train gpt --stages dp=1,tp=2/dp=2 --steps 2 --batch 8 --seq 16 --d-model 32 --layers 2
       --heads 4 --json --out "$tmp" --backend mpi)
out=$(timeout 120 "${run[@]}" --enable-recovery -np 4 bash -c "o=''
  [[ \$OMPI_COMM_WORLD_RANK == 2 ]] && o='--lr x'
  $mc ${small[*]} \$o
  echo status \$?" 2>&1)
rc=$?
n=$(grep -c "^meshcast: rank 2: lr: " <<<"$out")
own=$(grep -c "^meshcast: lr: " <<<"$out")
twos=$(grep -c "^status 2$" <<<"$out")
if [[ $rc -ne 124 && $n -eq 3 && $own -eq 1 && $twos -eq 4 ]]; then ok
else bad "bad --lr on rank 2: rc=$rc, $n+$own of 4 said it, $twos exited 2: $out"; fi

# Rank 1 given other settings (valid alone): every rank refuses, naming the setting, before
# training; a config file that rank 3 cannot read, with --backend mpi on the command line, the
# same way as a bad option.
for opt in "--micro-batches 2" "--seed 2" "--schedule eager-1f1b" "--config $tmp/missing.json"; do
  name=${opt%% *}
  who=1; [[ $name == --config ]] && who=3
  out=$(timeout 120 "${run[@]}" --enable-recovery -np 4 bash -c "o=''
    [[ \$OMPI_COMM_WORLD_RANK == $who ]] && o='$opt'
    exec $mc ${small[*]} \$o" 2>&1)
  rc=$?
  if [[ $name == --config ]]; then
    n=$(grep -c "^meshcast: rank 3: config: " <<<"$out")
    want=3
  else
    n=$(grep -c "^meshcast: ${name#--}: rank 1 was started with a different" <<<"$out")
    want=4
  fi
  if [[ $rc -ne 124 && $n -eq $want ]]; then ok; else bad "$opt on rank $who: rc=$rc, $n of 4 refused: $out"; fi
done

# Rank 1's text differs from the others' under the same name and size (each host's own copy):
# refused naming data, where stage 0 took its inputs from one text and the last stage its
# targets from the other.
mkdir -p "$tmp/wa" "$tmp/wb"
for w in a b; do
  python3 -c 'import random, sys; random.seed(sys.argv[2])
open(sys.argv[1], "w").write("".join(random.choice("abcdefgh \n") for _ in range(30000)))' \
    "$tmp/w$w/corpus.txt" "$w"
done
out=$(timeout 120 "${run[@]}" --enable-recovery -np 4 bash -c "d=$tmp/wa
  [[ \$OMPI_COMM_WORLD_RANK == 1 ]] && d=$tmp/wb
  cd \$d && exec $(readlink -f "$mc") ${small[*]} --data corpus.txt" 2>&1)
rc=$?
n=$(grep -c "^meshcast: data: rank 1 was started with a different" <<<"$out")
if [[ $rc -ne 124 && $n -eq 4 ]]; then ok; else bad "another text on rank 1: rc=$rc, $n of 4 refused: $out"; fi

echo "train_mpi: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
