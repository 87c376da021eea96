#!/usr/bin/env bash
# The UCX backend started without mpirun, through the TCP rendezvous (TcpBootstrap::from_env):
# N processes launched in the background on 127.0.0.1 and a free port, rank 0 last (so the
# others must retry until it listens). Every process must succeed, within a bound.
# Usage: ucx_tcp.sh reshard RESHARD_MPI N   random cases of tests/mpi/reshard_mpi, mode ucx-tcp
#        ucx_tcp.sh cli MESHCAST             `meshcast reshard --backend ucx`: a verified run, bad
#                                            input (exit 2, one line naming the variable, bounded
#                                            memory), a rank 1 with nobody listening (exit 3, no
#                                            hang), an idle connection to rank 0 (the job still
#                                            runs), and two jobs on one port (never merged)
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mode=$1
prog=$2
source "$(dirname "${BASH_SOURCE[0]}")/../support/ranks.sh"

tmp=$(mktemp -d)
helpers=()
cleanup() {
  for pid in "${pids[@]}" "${helpers[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# wait_listening PORT: returns once something listens on 127.0.0.1:PORT (at most 30 s).
wait_listening() {
  python3 -c 'import socket, sys, time
end = time.time() + 30
while time.time() < end:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1]))).close()
        break
    except OSError:
        time.sleep(0.005)' "$1"
}

# hold_idle PORT: in the background, a connection to PORT that sends nothing (like
# `nc 127.0.0.1 PORT`), opened as soon as something listens there and held for 60 s.
hold_idle() {
  python3 -c 'import socket, sys, time
end = time.time() + 60
while time.time() < end:
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        break
    except OSError:
        time.sleep(0.002)
time.sleep(max(0, end - time.time()))' "$1" &
  helpers+=($!)
}

# launch N SECONDS CMD...: one job of N ranks on 127.0.0.1 ($PORT if set, else a free port),
# as start_ranks runs them.
launch() {
  job_port=${PORT:-$(free_port)} job_size=$1
  start_ranks "$1" "$2" tcp_vars "${@:3}"
}
tcp_vars() {
  echo "MESHCAST_RENDEZVOUS=127.0.0.1:$job_port MESHCAST_RANK=$1 MESHCAST_SIZE=$job_size"
}

# check_all N WHAT: every rank exited 0.
check_all() {
  local failed
  failed=$(rank_failures "$1")
  if [[ -z $failed ]]; then ok; else bad "$2:$failed"; fi
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
    # Numbers as people write them (strtod alone took hex and leading blanks); a launcher's name
    # is checked when MESHCAST_RANK and MESHCAST_SIZE leave it unused too.
    for t in 0x1 " 1" inf; do
      check_bad MESHCAST_RENDEZVOUS_TIMEOUT MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 \
        MESHCAST_SIZE=4 "MESHCAST_RENDEZVOUS_TIMEOUT=$t"
    done
    check_bad MESHCAST_TIMEOUT MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 MESHCAST_SIZE=4 \
      MESHCAST_TIMEOUT=0x5
    check_bad MESHCAST_LAUNCHER MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 MESHCAST_SIZE=4 \
      MESHCAST_LAUNCHER=bogus
    # A huge job size is refused before anything is sized by it: one short line, little memory
    # (it once took 7.4 GB and printed an 889 MB line).
    check_bad MESHCAST_SIZE MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 MESHCAST_SIZE=100000000
    err=$(/usr/bin/time -f %M -o "$tmp/rss" env MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 \
          MESHCAST_SIZE=100000000 timeout 20 "$mc" "${args[@]}" 2>&1 >/dev/null)
    rss=$(tail -n 1 "$tmp/rss")
    if [[ ${#err} -lt 300 && $err == *"exceeds the limit of"* && $rss =~ ^[0-9]+$ && $rss -lt 1000000 ]]
    then ok; else bad "MESHCAST_SIZE=100000000: ${rss} KiB, ${#err} bytes: ${err:0:300}"; fi
    # A job of one process needs no rendezvous partner; too few processes for the meshes.
    check_bad MESHCAST_SIZE MESHCAST_RENDEZVOUS=127.0.0.1:1 MESHCAST_RANK=0 MESHCAST_SIZE=1

    # Rank 1 with nobody listening: CommError("bootstrap") after the timeout, not a hang.
    port=$(free_port)
    start=$(date +%s.%N)
    err=$(MESHCAST_RENDEZVOUS=127.0.0.1:$port MESHCAST_RANK=1 MESHCAST_SIZE=4 \
          MESHCAST_RENDEZVOUS_TIMEOUT=1.5 timeout 10 "$mc" "${args[@]}" 2>&1 >/dev/null)
    rc=$?
    took=$(python3 -c "import sys; print(round($(date +%s.%N) - $start, 1))")
    # (Every attempt was refused: the reason says so, not "timed out".)
    if [[ $rc -eq 3 && $err == "meshcast: bootstrap: rank 1 could not connect to rank 0 at 127.0.0.1:$port within 1.5 s: Connection refused" ]] &&
       python3 -c "import sys; sys.exit(not 1.4 < $took < 8)"; then ok; else
      bad "nobody listening: rc=$rc after $took s: $err"; fi

    # Rank 0 alone of 2: the missing rank is named after the timeout.
    err=$(MESHCAST_RENDEZVOUS=127.0.0.1:$port MESHCAST_RANK=0 MESHCAST_SIZE=2 \
          MESHCAST_RENDEZVOUS_TIMEOUT=1 timeout 10 "$mc" "${args[@]}" 2>&1 >/dev/null)
    rc=$?
    if [[ $rc -eq 3 && $err == "meshcast: bootstrap: only 0 of 1 ranks connected"*"missing: rank 1"* ]]; then ok; else
      bad "rank 0 alone: rc=$rc: $err"; fi

    # An idle connection to rank 0 (it used to block its serial accept loop until the timeout,
    # then "only 0 of 3 ranks connected"): the job runs all the same.
    PORT=$(free_port)
    hold_idle "$PORT"
    PORT=$PORT launch 4 120 env MESHCAST_RENDEZVOUS_TIMEOUT=30 "$mc" "${args[@]}"
    check_all 4 "with an idle connection to rank 0"

    # Two jobs on one port (keys A and B): B starts while A's rank 0 listens, A's others after B
    # ended. B's rank 0 cannot listen, B's others are refused (exit 3, one line naming why);
    # A runs and verifies with its own members.
    PORT=$(free_port)
    MESHCAST_RENDEZVOUS=127.0.0.1:$PORT MESHCAST_RANK=0 MESHCAST_SIZE=4 MESHCAST_JOB_KEY=A \
      timeout 120 "$mc" "${args[@]}" >"$tmp/a.0" 2>&1 &
    a0=$!
    helpers+=($a0)
    wait_listening "$PORT"
    MESHCAST_JOB_KEY=B PORT=$PORT launch 4 60 "$mc" "${args[@]}"
    b_ok=1
    for ((r = 0; r < 4; r++)); do
      want="belongs to another job"
      [[ $r -eq 0 ]] && want="cannot listen on 127.0.0.1:$PORT: Address already in use"
      line=$(cat "$tmp/out.$r")
      if [[ ${rcs[r]} -ne 3 || $(wc -l <<<"$line") -ne 1 || $line != "meshcast: bootstrap: "*"$want"* ]]; then
        b_ok=0
        bad "job B rank $r: rc=${rcs[r]}: ${line:0:300}"
      fi
    done
    [[ $b_ok -eq 1 ]] && ok
    for ((r = 1; r < 4; r++)); do
      MESHCAST_RENDEZVOUS=127.0.0.1:$PORT MESHCAST_RANK=$r MESHCAST_SIZE=4 MESHCAST_JOB_KEY=A \
        timeout 120 "$mc" "${args[@]}" >"$tmp/a.$r" 2>&1 &
      pids[r]=$!
    done
    a_failed=""
    wait "$a0" || a_failed+=" rank 0: rc=$? ($(head -c 300 "$tmp/a.0"))"
    for ((r = 1; r < 4; r++)); do
      wait "${pids[r]}" || a_failed+=" rank $r: rc=$? ($(head -c 300 "$tmp/a.$r"))"
    done
    pids=()
    verified=$(python3 -c 'import json,sys
print(json.loads(open(sys.argv[1]).readline()).get("verified"))' "$tmp/a.0" 2>/dev/null)
    if [[ -z $a_failed && $verified == True ]]; then ok; else
      bad "job A beside job B:$a_failed verified=$verified"; fi
    ;;
  *)
    echo "usage: ucx_tcp.sh reshard RESHARD_MPI N | ucx_tcp.sh cli MESHCAST" >&2
    exit 2
    ;;
esac

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
