#!/usr/bin/env bash
# An emulated cluster on this machine: H network namespaces ("hosts") mc-host0 .. mc-host{H-1}
# on one bridge, each with an interface net0 whose egress is shaped with tbf to RATE (default
# 1gbit): one slow network link per host, shared memory inside it. --duplex shapes its ingress
# to RATE as well (a tbf on the bridge's end of the link), as a NIC of RATE in each direction
# is: without it a host can receive from several hosts at once, faster than RATE. MPI jobs run
# across them with K ranks per host (rank r on host r / K), over TCP between hosts and vader
# inside.
#
#   cluster.sh up   [--hosts H] [--rate RATE] [--nics K] [--duplex]  # bring the hosts up
#   cluster.sh down                               # tear everything down (idempotent)
#   cluster.sh status
#   cluster.sh run  [--hosts H] [--ranks-per-host K] [--rate RATE] [--duplex] [--nic-per-rank]
#                   [--keep] -- PROGRAM ARGS...
#       up, mpirun -np H*K PROGRAM ARGS across the hosts, down (always: a trap tears the hosts
#       down on success, failure or Ctrl-C, unless --keep). Refuses when hosts are already up.
#       Exit status: PROGRAM's (mpirun's).
#   cluster.sh check                              # exit 0 if namespaces work here, else 77 + why
#
# --nic-per-rank (up: --nics K): a NIC per device, as on DGX-style hosts, instead of one per
# host. Each host then also has K namespaces mc-hostHnI, each with its own net0 shaped to RATE,
# and local rank I of host H runs in mc-hostHnI (bench/cluster/nic.sh moves it there); the
# ranks of a host still share memory (they keep the host's name, so Open MPI takes them for
# neighbours). The host's own namespace then carries only the launcher's traffic.
#
# Needs root, iproute2 (ip, tc) and util-linux (unshare). Uses only 10.200.0.0/24, the bridge
# mc-br0 and namespaces named mc-host*. Environment: MPIRUN (mpirun), MPI_EXTRA (more mpirun
# arguments), TBF_LATENCY (the shaper's queue, default 50ms).
set -euo pipefail

prefix=mc-host
bridge=mc-br0
net=10.200.0
duplex=0  # 1: ingress shaped too (--duplex)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
  echo "cluster.sh: $*" >&2
  exit 2
}

# Why namespaces cannot be used here, or nothing.
unusable() {
  if [[ $(id -u) != 0 ]]; then
    echo "needs root (network namespaces and tc); run as root"
    return
  fi
  local tool
  for tool in ip tc unshare; do
    command -v "$tool" >/dev/null || {
      echo "$tool not found (install iproute2 and util-linux)"
      return
    }
  done
  if ! ip netns add mc-probe 2>/dev/null; then
    echo "cannot create network namespaces here (ip netns add failed)"
    return
  fi
  ip netns del mc-probe 2>/dev/null || true
}

hosts_up() { ip netns list 2>/dev/null | awk '{print $1}' | grep -c "^$prefix" || true; }

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  # The veth ends in the root namespace go with their peers; remove any left by a crash.
  for ns in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep "^mc-v" || true); do
    ip link del "$ns" 2>/dev/null || true
  done
}

# A namespace NS on the bridge at address $net.ADDR, its net0 veth named VETH on the bridge side,
# egress shaped to RATE (none: unshaped), and with --duplex its ingress too: the bridge's end
# sends into the namespace through a tbf of its own.
attach() {  # attach NS VETH ADDR RATE
  local ns=$1 veth=$2 addr=$3 rate=$4
  local tbf=(tbf rate "$rate" burst 128kb latency "${TBF_LATENCY:-50ms}")
  ip netns add "$ns"
  ip link add "$veth" type veth peer name net0 netns "$ns"
  ip link set "$veth" master "$bridge" up
  ip -n "$ns" addr add "$net.$addr/24" dev net0
  ip -n "$ns" link set net0 up
  ip -n "$ns" link set lo up
  [[ $rate == none ]] && return
  ip netns exec "$ns" tc qdisc add dev net0 root "${tbf[@]}"
  ((duplex == 0)) || tc qdisc add dev "$veth" root "${tbf[@]}"
}

up() {  # up HOSTS RATE NICS (0: one shaped link per host; K: K shaped NIC namespaces per host)
  local hosts=$1 rate=$2 nics=$3 i n
  [[ $hosts =~ ^[0-9]+$ && $hosts -ge 1 && $hosts -le 200 ]] || die "--hosts: want 1..200, got '$hosts'"
  [[ $rate =~ ^[0-9]+(k|m|g)?bit$ ]] || die "--rate: want a tc rate like 1gbit or 500mbit, got '$rate'"
  [[ $nics =~ ^[0-9]+$ ]] && ((nics == 0 || hosts * (nics + 1) <= 200)) ||
    die "--nics: want hosts x (nics + 1) <= 200 addresses, got $hosts hosts x '$nics' NICs"
  local why
  why=$(unusable)
  [[ -z $why ]] || die "$why"
  down
  ip link add "$bridge" type bridge
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  for ((i = 0; i < hosts; i++)); do
    if ((nics == 0)); then
      attach "$prefix$i" "mc-v$i" $((10 + i)) "$rate"  # the host's one network link
    else
      # The launcher's namespace is not a bottleneck; each NIC is.
      attach "$prefix$i" "mc-v$i" $((10 + i)) none
      for ((n = 0; n < nics; n++)); do
        attach "$prefix${i}n$n" "mc-v${i}n$n" $((10 + hosts + i * nics + n)) "$rate"
      done
    fi
  done
  echo "cluster.sh: $hosts hosts up (${prefix}0..$prefix$((hosts - 1)), $net.10+," \
    "$( ((duplex)) && echo "$rate each way" || echo "egress $rate")" \
    "$( ((nics == 0)) && echo "per host" || echo "per NIC, $nics NICs per host"))" >&2
}

status() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix" || true); do
    echo "$ns: $(ip -n "$ns" -o -4 addr show dev net0 | awk '{print $4}')" \
      "out: $(ip netns exec "$ns" tc qdisc show dev net0 | head -1)" \
      "in: $(tc qdisc show dev "mc-v${ns#"$prefix"}" 2>/dev/null | head -1)"
  done
}

run() {
  local hosts=4 per=2 rate=1gbit nic=0
  keep=0  # global: the EXIT trap reads it after run returns
  while [[ $# -gt 0 ]]; do
    case $1 in
      --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
      --ranks-per-host) per=${2:?--ranks-per-host needs a value}; shift 2 ;;
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --duplex) duplex=1; shift ;;
      --nic-per-rank) nic=1; shift ;;
      --keep) keep=1; shift ;;
      --) shift; break ;;
      *) die "unknown argument '$1' (run: [--hosts H] [--ranks-per-host K] [--rate R] [--duplex] [--nic-per-rank] [--keep] -- PROGRAM ARGS)" ;;
    esac
  done
  [[ $# -gt 0 ]] || die "run: no program (cluster.sh run [options] -- PROGRAM ARGS)"
  [[ $per =~ ^[0-9]+$ && $per -ge 1 && $per -le 64 ]] || die "--ranks-per-host: want 1..64, got '$per'"
  # Hosts already up belong to another run: never take them over or tear them down from here.
  if [[ $(hosts_up) -gt 0 ]]; then
    die "hosts $prefix* are already up (another run?); 'cluster.sh down' first"
  fi
  tmp=$(mktemp -d /tmp/mc-cluster.XXXXXX)
  trap '[[ $keep == 1 ]] || down; rm -rf "$tmp"' EXIT
  trap 'exit 130' INT TERM
  up "$hosts" "$rate" $((nic * per))
  local i
  for ((i = 0; i < hosts; i++)); do echo "$prefix$i slots=$per"; done >"$tmp/hostfile"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # A rank in its NIC's namespace reaches its host's launcher (the PMIx server) over the bridge,
  # not over the loopback of another namespace.
  ((nic)) && export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include="$net.0/24"
  local extra=() wrap=()
  [[ -n ${MPI_EXTRA:-} ]] && read -r -a extra <<<"$MPI_EXTRA"
  ((nic)) && wrap=("$here/nic.sh")
  # mpi_yield_when_idle: the hostfile's slots hide the oversubscription of a small machine
  # from Open MPI, whose idle ranks would then spin in barriers and starve the working ones.
  # --bind-to none: Open MPI binds jobs of at most 2 ranks to cores, and every host's daemon
  # would bind its first rank to core 0 of the one machine they all share (2 hosts of one rank
  # each computed on one core: 58 ms per training step against 34 unbound).
  set +e
  "${MPIRUN:-mpirun}" --hostfile "$tmp/hostfile" -np $((hosts * per)) --map-by slot \
    --bind-to none --mca plm_rsh_agent "$here/agent.sh" --mca oob_tcp_if_include "$net.0/24" \
    --mca btl tcp,self,vader --mca btl_tcp_if_include "$net.0/24" \
    --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 "${extra[@]}" \
    "${wrap[@]}" "$@"
  local rc=$?
  set -e
  return "$rc"
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  up)
    hosts=4 rate=1gbit nics=0
    while [[ $# -gt 0 ]]; do
      case $1 in
        --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
        --rate) rate=${2:?--rate needs a value}; shift 2 ;;
        --nics) nics=${2:?--nics needs a value}; shift 2 ;;
        --duplex) duplex=1; shift ;;
        *) die "unknown argument '$1' (up: [--hosts H] [--rate R] [--nics K] [--duplex])" ;;
      esac
    done
    up "$hosts" "$rate" "$nics"
    ;;
  down) down ;;
  status) status ;;
  run) run "$@" ;;
  check)
    why=$(unusable)
    if [[ -n $why ]]; then
      echo "emulated hosts unavailable: $why"
      exit 77
    fi
    ;;
  *) die "usage: cluster.sh up|down|status|check|run (see the comment at the top)" ;;
esac
