#!/usr/bin/env bash
# Runs tests/mpi/failure_mpi under mpirun (--enable-recovery keeps the survivors running when a
# rank dies), mid-reshard and mid-collective: every surviving rank must report a CommError naming
# device 1, within the bound.
# Usage: BACKENDS="mpi ucx" failure.sh DRIVER MPIEXEC
set -u
driver=$1
run=("$2" --allow-run-as-root --oversubscribe --mca btl self,vader --enable-recovery)
timeout_s=5
fail=0
for backend in ${BACKENDS:-mpi}; do
for op in reshard collective; do
# UCX mid-collective: a survivor whose ring neighbour already left on the news can see that
# neighbour's endpoint close before the news itself and name the neighbour: not checked there.
[[ $backend == ucx && $op == collective ]] && continue
for mode in throw exit; do
  # A collective's arguments are checked before anything is sent and a refused call tells no
  # one (every member checks the same arguments): mid-collective failure is a rank that dies.
  [[ $op == collective && $mode == throw ]] && continue
  for np in 4 8; do
    out=$(timeout 120 "${run[@]}" -np $np "$driver" $backend $mode $timeout_s $op 2>&1)
    rc=$?
    got=$(grep -c "CommError after .*device 1" <<<"$out")
    slow=$(awk -v b=$((timeout_s + 10)) '/CommError after/ { if ($4 + 0 > b) n++ } END { print n + 0 }' <<<"$out")
    if [[ $rc -eq 124 || $got -ne $((np - 1)) || $slow -ne 0 ]]; then
      echo "FAIL $backend $op $mode np=$np: rc=$rc, $got of $((np - 1)) survivors named device 1, $slow too slow"
      echo "$out" | grep -v '^\[' | head -20
      fail=1
    else
      echo "ok   $backend $op $mode np=$np: $(grep -o 'CommError after [0-9.]* s' <<<"$out" | sort -k3 -n | tail -1)"
    fi
  done
done
done
done
exit $fail
