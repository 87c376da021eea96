# Shared by tests/mpi/launchers.sh and tests/mpi/ucx_tcp.sh (sourced): pass/fail counting, and the
# ranks of one job started as background processes, each with its own launcher variables. The
# caller sets $tmp (a scratch folder) and kills "${pids[@]}" on exit.
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
pids=()

# free_port [LO HI] [--pair]: a free port for a job's rendezvous (tests/support/free_port.py).
free_port() { python3 "$(dirname "${BASH_SOURCE[0]}")/free_port.py" "$@"; }

# start_ranks N SECONDS VARS CMD...: ranks N-1..0 in the background (rank 0 last, so that the
# others must retry until it listens), each under `timeout SECONDS` with the variables `VARS r`
# prints (NAME=VALUE words); output of rank r in $tmp/out.r; waits for all; sets rcs[r].
start_ranks() {
  local n=$1 secs=$2 vars=$3 r
  shift 3
  pids=()
  for ((r = n - 1; r >= 0; r--)); do
    # shellcheck disable=SC2046  # the variables are words
    env $($vars "$r") timeout "$secs" "$@" >"$tmp/out.$r" 2>&1 &
    pids[r]=$!
  done
  rcs=()
  for ((r = 0; r < n; r++)); do
    wait "${pids[r]}"
    rcs[r]=$?
  done
  pids=()
}

# rank_failures N: " rank R: rc=S (its output)" for each of the last job's N ranks that did not
# exit 0; nothing when all did.
rank_failures() {
  local r
  for ((r = 0; r < $1; r++)); do
    [[ ${rcs[r]} -eq 0 ]] || echo -n " rank $r: rc=${rcs[r]} ($(tr '\n' ' ' <"$tmp/out.$r" | head -c 300))"
  done
}
