#!/usr/bin/env bash
# `meshcast reshard` started the way launchers start it (LaunchEnv, TcpBootstrap::from_env), and
# --topology auto (discover_topology) across processes. Each run must verify.
#   ucx: 4 processes with only torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
#        MASTER_PORT; rank 0 listens on MASTER_PORT + 1), then only Slurm's (SLURM_PROCID,
#        SLURM_NTASKS, SLURM_LOCALID, a compressed SLURM_JOB_NODELIST, the port derived from
#        SLURM_JOB_ID and SLURM_STEP_ID), then mpirun's ranks with MASTER_ADDR/MASTER_PORT (a TCP
#        rendezvous, MPI never initialised); a bad MASTER_PORT (exit 2, one line naming it).
#   auto: per backend (mpi under mpirun, ucx under mpirun and under torchrun's variables),
#        MESHCAST_HOSTNAME set per rank to h0 h0 h1 h1: the discovered topology places devices
#        as meshes/emulated-2x2.json does (the same bytes across hosts as `meshcast plan` there),
#        and one host name for all gives no bytes across hosts.
# Usage: launchers.sh MESHCAST MPIEXEC   (BACKENDS: the process backends built, e.g. "mpi ucx")
# shellcheck disable=SC2054,SC2016  # commas in shapes; $ expanded by the wrapped bash
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mc=$1
mpirun=("$2" --allow-run-as-root --oversubscribe --mca btl self,vader)
backends=${BACKENDS:-mpi ucx}
source "$(dirname "${BASH_SOURCE[0]}")/../support/ranks.sh"

tmp=$(mktemp -d)
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# No variable of the caller's own job may leak into these.
unset MESHCAST_RENDEZVOUS MESHCAST_RANK MESHCAST_SIZE MESHCAST_LOCAL_RANK MESHCAST_LAUNCHER \
  MESHCAST_JOB_KEY RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT SLURM_PROCID SLURM_NTASKS \
  SLURM_LOCALID SLURM_JOB_ID SLURM_STEP_ID SLURM_JOB_NODELIST SLURM_STEP_NODELIST MESHCAST_HOSTNAME

json_field() {  # FILE KEY: the key of the first JSON line of FILE
  python3 -c 'import json, sys
print(json.loads(open(sys.argv[1]).readline()).get(sys.argv[2]))' "$1" "$2" 2>/dev/null
}

args=(reshard --shape 64,48 --dtype f32 --src 2x2@0-3:S0S1 --dst "4@[3,2,1,0]:RS0" --iters 2
      --verify --json --strategy broadcast --balance none)

# verified N WHAT: every rank exited 0, rank 0 printed verified JSON, the others nothing.
verified() {
  local n=$1 what=$2 failed v others
  failed=$(rank_failures "$n")
  v=$(json_field "$tmp/out.0" verified)
  others=$(cat "$tmp"/out.[1-9] 2>/dev/null | wc -c)
  if [[ -z $failed && $v == True && $others -eq 0 ]]; then ok; else
    bad "$what:$failed verified=$v, other ranks printed $others bytes"; fi
}

# What meshcast plan says crosses hosts with devices {0,1} and {2,3} on two hosts.
expected_network=$(timeout 60 "$mc" plan "${args[@]:1:8}" --strategy broadcast --balance none \
  --topology meshes/emulated-2x2.json --json 2>/dev/null | python3 -c 'import json, sys
j = json.load(sys.stdin)
print(j.get("stats", j).get("bytes_network"))' 2>/dev/null)
if [[ $expected_network =~ ^[1-9][0-9]*$ ]]; then ok; else
  bad "plan on emulated-2x2: bytes_network='$expected_network'"; fi

# check_auto WHAT HOSTS: rank 0's JSON names the discovered topology and its bytes across hosts
# are those of emulated-2x2 (two host names) or none (one).
check_auto() {
  local what=$1 hosts=$2 topo net want=0
  [[ $hosts -eq 2 ]] && want=$expected_network
  topo=$(json_field "$tmp/out.0" topology)
  net=$(json_field "$tmp/out.0" bytes_network)
  if [[ $topo == discovered && $net == "$want" ]]; then ok; else
    bad "$what: topology=$topo bytes_network=$net (want $want)"; fi
}

if [[ " $backends " == *" ucx "* ]]; then
  # torchrun's variables only.
  port=$(free_port --pair)
  torchrun_vars() {
    echo "RANK=$1 WORLD_SIZE=4 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port - 1))" \
      "TORCHELASTIC_RUN_ID=launchers-$port"
  }
  start_ranks 4 120 torchrun_vars "$mc" "${args[@]}" --backend ucx
  verified 4 "ucx under torchrun's variables"

  # Too few ranks for the meshes: each rank refuses, naming the variable that gave the size.
  port=$(free_port --pair)
  two_vars() { torchrun_vars "$1" | sed 's/WORLD_SIZE=4/WORLD_SIZE=2/'; }
  start_ranks 2 60 two_vars "$mc" "${args[@]}" --backend ucx
  want="meshcast: WORLD_SIZE: the meshes use device ids up to 3, so it must be at least 4 (it is 2)"
  if [[ ${rcs[0]} -eq 2 && ${rcs[1]} -eq 2 && $(cat "$tmp/out.0") == "$want" &&
        $(cat "$tmp/out.1") == "$want" ]]; then ok; else
    bad "2 ranks under torchrun's variables:$(rank_failures 2)"; fi

  # Slurm's variables only: the port is 10000 + (16 * job + step) mod 20000.
  port=$(free_port 10000 30000 --pair)
  job=$(((port - 10000) / 16)) step=$(((port - 10000) % 16))
  slurm_vars() {
    echo "SLURM_PROCID=$1 SLURM_NTASKS=4 SLURM_LOCALID=$1 SLURM_JOB_ID=$job SLURM_STEP_ID=$step" \
      "SLURM_JOB_NODELIST=127.0.0.[1-2],other"
  }
  start_ranks 4 120 slurm_vars "$mc" "${args[@]}" --backend ucx
  verified 4 "ucx under Slurm's variables (port $port)"

  # mpirun's ranks with MASTER_ADDR/MASTER_PORT: the TCP rendezvous, MPI never initialised.
  port=$(free_port --pair)
  timeout 120 "${mpirun[@]}" -np 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((port - 1)) \
    "$mc" "${args[@]}" --backend ucx >"$tmp/mpirun.out" 2>&1
  rc=$?
  lines=$(grep -c '^{' "$tmp/mpirun.out")
  v=$(grep '^{' "$tmp/mpirun.out" | head -n 1 >"$tmp/out.0"; json_field "$tmp/out.0" verified)
  if [[ $rc -eq 0 && $lines -eq 1 && $v == True ]]; then ok; else
    bad "ucx under mpirun with MASTER_*: rc=$rc lines=$lines verified=$v: $(head -c 300 "$tmp/mpirun.out")"
  fi

  # A bad variable: exit 2, one line naming it, before any connection.
  err=$(env RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=abc timeout 20 "$mc" \
        "${args[@]}" --backend ucx 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq 2 && $(wc -l <<<"$err") -eq 1 && $err == "meshcast: MASTER_PORT: expected a port"* ]]
  then ok; else bad "MASTER_PORT=abc: rc=$rc: $err"; fi
  err=$(env RANK=0 WORLD_SIZE=4 timeout 20 "$mc" "${args[@]}" --backend ucx 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq 2 && $err == "meshcast: MASTER_ADDR: not set; torchrun's RANK and WORLD_SIZE"* ]]
  then ok; else bad "no MASTER_ADDR: rc=$rc: $err"; fi

  # A bad MESHCAST_HOSTNAME of one rank's own (here under --topology auto, for reshard and sync):
  # every rank exits 2, the others naming that rank at once (they were left as by a rank that
  # ended, exit 3, or printed its line as their own).
  echo '{"w": {"shape": [64, 48], "dtype": "F32", "src": "2x2@0-3:S0S1", "dst": "4@0-3:RS0"}}' \
    >"$tmp/model.json"
  long=$(printf 'x%.0s' {1..300})
  for c in "MESHCAST_HOSTNAME=$long|reshard|MESHCAST_HOSTNAME: 300 characters: a host name has at most 255" \
    "MESHCAST_HOSTNAME=$long|sync|MESHCAST_HOSTNAME: 300 characters: a host name has at most 255"; do
    IFS='|' read -r var cmd want <<<"$c"
    port=$(free_port --pair)
    odd_vars() { echo "$(torchrun_vars "$1")"; [[ $1 -eq 2 ]] && echo "$var"; }
    if [[ $cmd == reshard ]]; then
      start_ranks 4 60 odd_vars "$mc" "${args[@]}" --backend ucx --topology auto
    else
      start_ranks 4 60 odd_vars "$mc" sync --model "$tmp/model.json" --backend ucx --iters 1 \
        --topology auto
    fi
    good=0
    for r in 0 1 2 3; do
      line="meshcast: rank 2: $want"
      [[ $r -eq 2 ]] && line="meshcast: $want"
      [[ ${rcs[r]} -eq 2 && $(cat "$tmp/out.$r") == "$line" ]] && good=$((good + 1))
    done
    if [[ $good -eq 4 ]]; then ok; else bad "${var%%=*} bad on rank 2 ($cmd):$(rank_failures 4)"; fi
  done

  # --topology auto under torchrun's variables: two host names, then one.
  for hosts in 2 1; do
    port=$(free_port --pair)
    extra_of() { echo "MESHCAST_HOSTNAME=h$(($1 * hosts / 4))"; }
    auto_vars() { echo "$(torchrun_vars "$1") $(extra_of "$1")"; }
    start_ranks 4 120 auto_vars "$mc" "${args[@]}" --backend ucx --topology auto
    verified 4 "ucx --topology auto under torchrun's variables, $hosts host(s)"
    check_auto "ucx --topology auto under torchrun's variables" "$hosts"
  done
fi

# --topology auto under mpirun: MESHCAST_HOSTNAME from the rank, set by a wrapper.
for backend in $backends; do
  [[ $backend == mpi || $backend == ucx ]] || continue
  for hosts in 2 1; do
    timeout 120 "${mpirun[@]}" -np 4 bash -c \
      'MESHCAST_HOSTNAME=h$((OMPI_COMM_WORLD_RANK * '"$hosts"' / 4)) exec "$@"' wrapper \
      "$mc" "${args[@]}" --backend "$backend" --topology auto >"$tmp/mpirun.out" 2>&1
    rc=$?
    grep '^{' "$tmp/mpirun.out" | head -n 1 >"$tmp/out.0"
    v=$(json_field "$tmp/out.0" verified)
    if [[ $rc -eq 0 && $v == True ]]; then ok; else
      bad "$backend --topology auto under mpirun, $hosts host(s): rc=$rc verified=$v: $(head -c 300 "$tmp/mpirun.out")"
    fi
    check_auto "$backend --topology auto under mpirun" "$hosts"
  done
done

# A rank given a file where the others discover: refused (exit 2), not a hang.
err=$(timeout 120 "${mpirun[@]}" -np 4 bash -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@" --topology meshes/emulated-2x2.json; fi
   exec "$@" --topology auto' wrapper "$mc" "${args[@]}" --backend mpi 2>&1)
rc=$?
if [[ $rc -ne 0 && $rc -ne 124 && $err == *"meshcast: topology: rank 1 was started with a different topology"* ]]
then ok; else bad "auto beside a file: rc=$rc: ${err:0:300}"; fi

# auto:PRESET takes the preset's links; a preset that does not exist is refused by every rank.
timeout 120 "${mpirun[@]}" -np 4 "$mc" "${args[@]}" --backend mpi --topology auto:dgx-a100 \
  >"$tmp/mpirun.out" 2>&1
rc=$?
grep '^{' "$tmp/mpirun.out" | head -n 1 >"$tmp/out.0"
if [[ $rc -eq 0 && $(json_field "$tmp/out.0" verified) == True ]]; then ok; else
  bad "mpi --topology auto:dgx-a100: rc=$rc: $(head -c 300 "$tmp/mpirun.out")"; fi
err=$(timeout 60 "${mpirun[@]}" -np 2 "$mc" "${args[@]}" --backend mpi --topology auto:nope 2>&1)
rc=$?
if [[ $rc -ne 0 && $err == *"meshcast: topology: unknown topology 'nope'"* ]]; then ok; else
  bad "mpi --topology auto:nope: rc=$rc: ${err:0:300}"; fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
