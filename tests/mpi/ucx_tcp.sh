#!/usr/bin/env bash
# The UCX backend started without mpirun, through the TCP rendezvous (TcpBootstrap::from_env):
# N processes launched in the background on 127.0.0.1 and a free port, rank 0 last (so the
# others must retry until it listens). Every process must succeed, within a bound.
# Usage: ucx_tcp.sh reshard RESHARD_MPI N   random cases of tests/mpi/reshard_mpi, mode ucx-tcp
#        ucx_tcp.sh cli MESHCAST             `meshcast reshard --backend ucx`: a verified run, bad
#                                            input (exit 2, one line naming the variable), and a
#                                            rank 1 with nobody listening (exit 2, no hang)
set -u
mode=$1
prog=$2
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# launch N SECONDS CMD...: starts ranks N-1..0 of one job in the background, output of rank r in
# $tmp/out.r; waits for all (each under `timeout SECONDS`); sets rcs[r].
launch() {
  local n=$1 secs=$2
  shift 2
  local port r
  port=$(free_port)
  pids=()
  for ((r = n - 1; r >= 0; r--)); do
    MESHCAST_RENDEZVOUS=127.0.0.1:$port MESHCAST_RANK=$r MESHCAST_SIZE=$n \
      timeout "$secs" "$@" >"$tmp/out.$r" 2>&1 &
    pids[r]=$!
  done
  rcs=()
  for ((r = 0; r < n; r++)); do
    wait "${pids[r]}"
    rcs[r]=$?
  done
  pids=()
}

# check_all N WHAT: every rank exited 0.
check_all() {
  local n=$1 what=$2 r failed=""
  for ((r = 0; r < n; r++)); do
    [[ ${rcs[r]} -eq 0 ]] || failed+=" rank $r: rc=${rcs[r]} ($(tr '\n' ' ' <"$tmp/out.$r" | head -c 300))"
  done
  if [[ -z $failed ]]; then ok; else bad "$what:$failed"; fi
}

case $mode in
  reshard)
    n=$3
    launch "$n" 300 "$prog" ucx-tcp 250 20261121 chain 7
    check_all "$n" "reshard_mpi ucx-tcp, $n processes"
    summary=$(grep -h "^ucx: $n ranks" "$tmp/out.0")
    if [[ $summary == *", 0 failed cases" ]]; then ok; else bad "rank 0 summary: '$summary'"; fi
    cat "$tmp/out.0"
    ;;
  cli)
    mc=$prog
    args=(reshard --shape 64,48 --dtype f32 --src 2x2@0-3:S0S1 --dst "4@[3,2,1,0]:RS0" --backend ucx
          --iters 2 --verify --json)
    launch 4 120 "$mc" "${args[@]}"
    check_all 4 "meshcast ${args[*]}"
    verified=$(python3 -c 'import json,sys
print(json.loads(open(sys.argv[1]).readline()).get("verified"))' "$tmp/out.0" 2>/dev/null)
    others=$(cat "$tmp"/out.[123] | wc -c)
    if [[ $verified == True && $others -eq 0 ]]; then ok; else
      bad "cli json: verified=$verified, ranks 1-3 printed $others bytes"; fi

    # Bad input names the variable: exit 2, one line.
    check_bad() {  # EXPECTED-FIELD VAR=VALUE...
      local field=$1 err rc
      shift
      err=$(env "$@" timeout 20 "$mc" "${args[@]}" 2>&1 >/dev/null)
      rc=$?
      if [[ $rc -eq 2 && $(wc -l <<<"$err") -eq 1 && $err == "meshcast: $field: "* ]]; then ok; else
        bad "$*: rc=$rc: $err"; fi
    }
    check_bad MESHCAST_RANK MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=5 MESHCAST_SIZE=4
    check_bad MESHCAST_RANK MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_SIZE=4
    check_bad MESHCAST_SIZE MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 MESHCAST_SIZE=x4
    check_bad MESHCAST_RENDEZVOUS MESHCAST_RENDEZVOUS=127.0.0.1 MESHCAST_RANK=0 MESHCAST_SIZE=4
    check_bad MESHCAST_RENDEZVOUS MESHCAST_RENDEZVOUS=127.0.0.1:70000 MESHCAST_RANK=0 MESHCAST_SIZE=4
    check_bad MESHCAST_RENDEZVOUS_TIMEOUT MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 \
      MESHCAST_SIZE=4 MESHCAST_RENDEZVOUS_TIMEOUT=soon
    # A job of one process needs no rendezvous partner; too few processes for the meshes.
    check_bad MESHCAST_SIZE MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 MESHCAST_SIZE=1

    # Rank 1 with nobody listening: CommError("bootstrap") after the timeout, not a hang.
    port=$(free_port)
    start=$(date +%s.%N)
    err=$(MESHCAST_RENDEZVOUS=127.0.0.1:$port MESHCAST_RANK=1 MESHCAST_SIZE=4 \
          MESHCAST_RENDEZVOUS_TIMEOUT=1.5 timeout 10 "$mc" "${args[@]}" 2>&1 >/dev/null)
    rc=$?
    took=$(python3 -c "import sys; print(round($(date +%s.%N) - $start, 1))")
    if [[ $rc -eq 2 && $err == "meshcast: bootstrap: rank 1 could not connect to rank 0 at 127.0.0.1:$port within 1.5 s"* ]] &&
       python3 -c "import sys; sys.exit(not 1.4 < $took < 8)"; then ok; else
      bad "nobody listening: rc=$rc after $took s: $err"; fi

    # Rank 0 alone of 2: the missing rank is named after the timeout.
    err=$(MESHCAST_RENDEZVOUS=127.0.0.1:$port MESHCAST_RANK=0 MESHCAST_SIZE=2 \
          MESHCAST_RENDEZVOUS_TIMEOUT=1 timeout 10 "$mc" "${args[@]}" 2>&1 >/dev/null)
    rc=$?
    if [[ $rc -eq 2 && $err == "meshcast: bootstrap: only 0 of 1 ranks connected"*"missing: rank 1"* ]]; then ok; else
      bad "rank 0 alone: rc=$rc: $err"; fi
    ;;
  *)
    echo "usage: ucx_tcp.sh reshard RESHARD_MPI N | ucx_tcp.sh cli MESHCAST" >&2
    exit 2
    ;;
esac

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
