#!/usr/bin/env bash
# A multicast as a tree of chains (Op::group) under mpirun: on a topology of 4 hosts of 2
# devices the planner sends each box along a trunk through the hosts, each leader feeding its
# host's chain; `meshcast plan` shows a tree of at least 3 chains, and `meshcast reshard
# --backend mpi|ucx --verify` over 8 ranks delivers every element (contiguous and strided boxes).
# Usage: tree_mpi.sh MESHCAST MPIEXEC
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mc=$1
run=("$2" --allow-run-as-root --oversubscribe --mca btl self,vader)
topo=$(mktemp --suffix .json)
trap 'rm -f "$topo"' EXIT
cat >"$topo" <<'EOF'
{"name": "pairs", "links": {"intra": {"bandwidth_gbyte_s": 10, "latency_us": 2},
 "network": {"bandwidth_gbit_s": 10, "latency_us": 20}},
 "uniform": {"hosts": 4, "devices_per_host": 2}}
EOF
backends=(mpi)
"$mc" reshard --help | grep -q ucx && backends+=(ucx)
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

for args in "--shape 1048576 --dtype f32 --src 1@0:R --dst 7@1-7:R" \
            "--shape 512,384 --dtype f32 --src 2@0-1:RS0 --dst 6@2-7:RR"; do
  # shellcheck disable=SC2086
  text=$("$mc" plan $args --topology "$topo" --strategy broadcast 2>&1)
  if grep -Eq 'as ([3-9]|[1-9][0-9]+) chains' <<<"$text"; then ok; else
    bad "no tree of >= 3 chains in the plan of $args: $text"; fi
  for backend in "${backends[@]}"; do
    # shellcheck disable=SC2086
    out=$(timeout 120 "${run[@]}" -np 8 "$mc" reshard $args --topology "$topo" \
          --strategy broadcast --backend "$backend" --iters 2 --verify --json 2>&1)
    rc=$?
    verified=$(printf '%s\n' "$out" | grep '^{' | python3 -c 'import json,sys
print(json.loads(sys.stdin.readline()).get("verified"))' 2>/dev/null)
    if [[ $rc -eq 0 && $verified == True ]]; then ok; else
      bad "$backend $args: rc=$rc verified=$verified: $out"; fi
  done
done

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
