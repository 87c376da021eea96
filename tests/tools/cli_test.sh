#!/usr/bin/env bash
# Tests of the `meshcast` command line (DESIGN.md, "Command line").
# Usage: tests/tools/cli_test.sh path/to/meshcast      (run from anywhere; exit 0 when all pass)
#
# Tables: good reshards (--verify --json must report verified true, mismatches 0), bad inputs
# (exit status 2, exactly one line on stderr naming the field), plan --json / --svg output, the
# shipped topology files, the demo, and --help.
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
MC=${1:?usage: cli_test.sh path/to/meshcast}
MC=$(cd "$(dirname "$MC")" && pwd)/$(basename "$MC")
[ -x "$MC" ] || { echo "no executable at $MC"; exit 2; }
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: meshes/ lives there
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LIMIT=120  # seconds per command: nothing may hang

pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad_result() { fail=$((fail + 1)); echo "FAIL $*"; }

# Runs the CLI with a time limit; stdout -> $TMP/out, stderr -> $TMP/err, status -> $rc.
run() {
  timeout "$LIMIT" "$MC" "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
}

# The values of keys "$@" in the one JSON object of $TMP/out, space-separated, as JSON ("NOJSON"
# for each unless stdout is exactly one JSON document on one line; "MISSING" for an absent key).
json_field() {
  python3 - "$TMP/out" "$@" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().strip().splitlines()
try:
    assert len(lines) == 1
    obj = json.loads(lines[0])
    print(" ".join(json.dumps(obj.get(k, "MISSING")).replace(" ", "") for k in sys.argv[2:]))
except Exception:
    print(" ".join("NOJSON" for k in sys.argv[2:]))
EOF
}

# ---- good reshards: every strategy ----------------------------------------------------------
good() {  # args...
  run reshard "$@" --verify --json --iters 2
  local v m b s
  read -r v m b s < <(json_field verified mismatches bytes_moved seconds)
  if [ "$rc" -eq 0 ] && [ "$v" = true ] && [ "$m" = 0 ] && [[ "$b" =~ ^[0-9]+$ ]] &&
    [[ "$s" =~ ^[0-9.e+-]+$ ]]; then
    ok
  else
    bad_result "reshard $* -> rc=$rc verified=$v mismatches=$m bytes_moved=$b seconds=$s" \
      "$(head -c 300 "$TMP/err")"
  fi
}

GOOD_CASES=(
  "--shape 4096 --dtype bf16 --src 100@0-99:R+P0 --dst 2@100-101:S0"  # past bf16's exact sums
  "--shape 4096 --dtype f16 --src 70@0-69:R+P0 --dst 2x2@70-73:S0+P1"
  "--shape 8,6 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0"
  "--shape 10 --dtype i32 --src 1@0:R --dst 3@1-3:R"
  "--shape 9,4,2 --dtype f64 --src 3@0-2:S0RR --dst 2x2@0-3:RS0S1"
  "--shape 12,12 --dtype f32 --src 2x2@0-3:S0R+P1 --dst 2x2@0-3:RS0"
  "--shape 12,12 --dtype f32 --src 2x2@0-3:S0R --dst 2x2@4-7:RS1+P0"
  "--shape 5,7 --dtype bf16 --src 2x2@[3,1,2,0]:S1R --dst 4@0-3:S0R"
  "--shape 3,5 --dtype f16 --src 4@0-3:S0R --dst 2x3@2-7:S1S0"
  "--shape 7,0,3 --dtype i8 --src 2@0-1:S0RR --dst 2@2-3:RRS0"
  "--shape 64,48,8 --dtype i64 --src 2x4@0-7:S0S1R --dst 2x4@8-15:RS0R --topology meshes/aws-p3.8xlarge.json"
  "--shape 32,32 --dtype f32 --src 2x2@0-3:S01R --dst 2x2@0-3:S10R --topology meshes/emulated.json"
)
for st in auto broadcast sendrecv allgather; do
  for bal in none greedy search; do
    for c in "${GOOD_CASES[@]}"; do
      # shellcheck disable=SC2086
      good $c --strategy "$st" --balance "$bal" --backend local
    done
  done
done

# Without --verify: verified false and mismatches null.
run reshard --shape 8,8 --dtype f32 --src 2x2@0-3:S0R --dst 4@4-7:RS0 --json
fields=$(json_field verified mismatches iters bytes_network strategy effective_gbps src dst shape dtype)
if [ "$rc" -eq 0 ] && [[ "$fields" =~ ^false\ null\ 5\ 0\ \"[a-z]+\"\ [0-9.e+-]+\ \"2x2@0-3:S0R\"\ \"4@4-7:RS0\"\ \[8,8\]\ \"f32\"$ ]]; then ok
else bad_result "reshard --json without --verify: rc=$rc $fields"; fi

# The human report names the things a reader looks for.
run reshard --shape 8,8 --dtype f32 --src 2x2@0-3:S0R --dst 4@4-7:RS0 --verify
if [ "$rc" -eq 0 ] && grep -q "strategy" "$TMP/out" && grep -q "bytes moved" "$TMP/out" &&
  grep -q "median" "$TMP/out" && grep -q "effective" "$TMP/out" &&
  grep -q "verified *yes" "$TMP/out"; then ok
else bad_result "reshard human report: rc=$rc $(cat "$TMP/out" "$TMP/err")"; fi

# ---- bad inputs: exit 2, one line on stderr naming the field -------------------------------
bad() {  # field, then args of `reshard` (of $CMD when set); the status is $STATUS (default 2)
  local want=$1
  shift
  run "${CMD:-reshard}" "$@"
  local lines
  lines=$(wc -l <"$TMP/err")
  if [ "$rc" -eq "${STATUS:-2}" ] && [ "$lines" -eq 1 ] && grep -qi -- "$want" "$TMP/err" && [ ! -s "$TMP/out" ]; then
    ok
  else
    bad_result "bad input ($want) reshard $* -> rc=$rc, $lines stderr lines: $(head -c 300 "$TMP/err")"
  fi
}
S=(--shape 8,8 --dtype f32)
bad src.mesh "${S[@]}" --src 2x2@0-4:S0R --dst 4@0-3:S0R --verify
# An option given empty is refused, not taken for its default (as sync's are).
for cmd in plan simulate reshard; do
  CMD=$cmd bad "topology: given empty" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology ""
done
CMD=demo bad "topology: given empty" --topology ""
for cmd in plan simulate reshard; do  # (--svg '' drew nothing, --rank '' printed the whole plan)
  CMD=$cmd bad "svg: given empty" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --svg ""
  CMD=$cmd bad "src: given empty" "${S[@]}" --src "" --dst 4@0-3:S0R
done
CMD=plan bad "rank: given empty" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --rank ""
CMD=simulate bad "rank: given empty" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --rank ""
# A device in neither mesh has an empty part (a device of a larger job), and is told why.
out=$("$MC" plan "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --rank 99)
if [[ $out == *" 0 ops "* && $out == *"device 99 is in neither mesh: it takes no part"* ]]; then ok
else bad_result "plan --rank 99: $out"; fi
bad "plan: given empty" --plan ""
# The local backend's transfers count its threads' turns on the cores: 1,024 threads moving
# 262,144 one-byte sends an iteration would have run for hours (80 us a transfer).
bad "run transfers: .*each counted" --shape 1024 --dtype u8 --src 512:S0 --dst 512@512-1023:R \
  --iters 500
# demo counts every byte its plans move (it counted one tensor a case, a quarter of them).
CMD=demo bad "run bytes: 40000 iterations and the warm-up, each of 128.00 MiB" --iters 40000
bad dst.mesh "${S[@]}" --src 2x2@0-3:S0R --dst 2x2@0-4:S0R --verify
bad src.mesh "${S[@]}" --src 2x2@[0,0,1,2]:S0R --dst 4@0-3:S0R --verify
bad src.spec "${S[@]}" --src 2x2@0-3:S0RR --dst 4@0-3:S0R --verify
bad spec --shape 8 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
bad dst.spec "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0S0 --verify
bad src.spec "${S[@]}" --src 2x2@0-3:S2R --dst 4@0-3:S0R --verify
bad src.spec "${S[@]}" --src 2x2@0-3:S0R+P0 --dst 4@0-3:S0R --verify
bad src.spec "${S[@]}" --src 2x2@0-3:Q0R --dst 4@0-3:S0R --verify
bad src.mesh "${S[@]}" --src 2x:S0R --dst 4@0-3:S0R --verify
bad src.mesh "${S[@]}" --src 2x4@:S0R --dst 4@0-3:S0R --verify
bad src.mesh "${S[@]}" --src x4:S0R --dst 4@0-3:S0R --verify
bad src "${S[@]}" --src 2x2@0-3 --dst 4@0-3:S0R --verify
bad shape --shape -4,4 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
bad shape --shape=-4,4 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
bad shape --shape 9223372036854775807,4 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
bad shape --shape 99999999999999999999,4 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
bad shape --shape 4,,4 --dtype f32 --src 2x2@0-3:S0RR --dst 4@0-3:S0RR --verify
bad shape --shape 4x4 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
bad dtype --shape 8,8 --dtype f33 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
STATUS=4 bad "topology: cannot read .*No such file" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/missing.json" --verify
bad topology "${S[@]}" --src 2x2@0-3:S0R --dst 4@40-43:S0R --topology meshes/aws-p3.8xlarge.json
bad strategy "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --strategy fastest --verify
bad balance "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --balance best --verify
bad backend "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --backend gloo --verify
# mpi without mpirun: a world of one rank, too small for these meshes (or, where MPI is not
# built in, the backend is refused); both name the backend. Open MPI keeps allocations for the
# life of the process, which LeakSanitizer would report (under the ASan build).
ASAN_OPTIONS=detect_leaks=0 bad backend "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --backend mpi
bad iters "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --iters 0 --verify
bad iters "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --iters -3 --verify
bad iters "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --iters many --verify
bad dst "${S[@]}" --src 2x2@0-3:S0R --verify
bad shape --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify
bad bogus "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --bogus
# Commands: a misspelt one is named with the choices; errors point to the subcommand's help.
CMD=bogus bad "meshcast: unknown command 'bogus' (commands: plan, simulate, reshard, demo, sync, train"
CMD=train bad "meshcast train: unknown command 'bert' (commands: gpt, utransformer" bert
bad "see meshcast reshard --help" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --bogus
# An option or a flag given twice (the second may differ from the first, as in a job's ranks).
bad "shape: At Most 1" "${S[@]}" --shape 4,4 --src 2x2@0-3:S0R --dst 4@0-3:S0R
bad "verify: At Most 1" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify --verify
CMD=sync bad "predict: At Most 1" --model models/gpt2-small.json --predict --predict
run --version
if [ "$rc" -eq 0 ] && grep -qx "meshcast [0-9]*\.[0-9]*\.[0-9]*" "$TMP/out"; then ok
else bad_result "--version: rc=$rc $(cat "$TMP/out" "$TMP/err")"; fi
bad backend "${S[@]}" --src 4@0-3:S0R --dst 1x1@2000000:RR
CMD=simulate bad chunk-bytes "${S[@]}" --src 2x2@0-3:S0R --dst 4@4-7:RS0 --chunk-bytes 0
CMD=simulate bad chunk-bytes "${S[@]}" --src 2x2@0-3:S0R --dst 4@4-7:RS0 --chunk-bytes 2k
CMD=plan bad chunk-bytes "${S[@]}" --src 2x2@0-3:S0R --dst 4@4-7:RS0 --chunk-bytes 2147483648
CMD=simulate bad topology "${S[@]}" --src 2x2@0-3:S0R --dst 4@40-43:S0R --topology meshes/aws-p3.8xlarge.json
CMD=simulate bad dst.spec "${S[@]}" --src 2x2@0-3:S0R --dst 4@4-7:S0S0
bad "buffer bytes" --shape 1000000,1000000 --dtype f64 --src 2x2@0-3:S0R --dst 4@0-3:S0R --verify

# A malformed topology file names the JSON path.
printf '{"name": "x", "links": {"intra": {"bandwidth_gbyte_s": 1, "latency_us": 1}, "network": {"bandwidth_gbit_s": 1, "latency_us": 1}}, "hosts": [{"devices": [0, 1]}, {"devices": [2, 1]}]}' >"$TMP/dup.json"
bad "topology.hosts\[1\].devices\[1\]" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/dup.json"
printf '{"name": "x", "links": {"intra": {"bandwidth_gbyte_s": 0, "latency_us": 1}}, "single_host": true}' >"$TMP/zero.json"
bad "topology.links.intra.bandwidth_gbyte_s" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/zero.json"
# Times and rates a link cannot have (1e308 us made every prediction infinite, written as null
# into a plan its own reader refused; a bandwidth 10^9 times another's outran the simulator).
printf '{"name": "x", "links": {"intra": {"bandwidth_gbyte_s": 1, "latency_us": 1}, "network": {"bandwidth_gbit_s": 1, "latency_us": 1, "overhead_us": 1e308}}, "hosts": [{"devices": [0, 1]}, {"devices": [2, 3]}]}' >"$TMP/slow.json"
bad "topology.links.network.overhead_us: must be in \[0, 1e7\]" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/slow.json"
printf '{"name": "x", "links": {"intra": {"bandwidth_gbyte_s": 1e12, "latency_us": 1}}, "single_host": true}' >"$TMP/fast.json"
bad "topology.links.intra.bandwidth_gbyte_s: too large" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/fast.json"
printf '{"name": "x", ' >"$TMP/trunc.json"
bad "topology" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/trunc.json"
bad "topology" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP"
# Nesting and values are bounded before a tree is built (read as a tree: topologies, configs).
python3 -c 'print("{\"name\": \"x\", \"single_host\": true, \"description\": " + "[" * 300 + "]" * 300 + "}")' >"$TMP/deep.json"
bad "topology: not valid JSON: nested too deeply" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/deep.json"
python3 -c 'print("[" + "0," * 4300000 + "0]")' >"$TMP/wide.json"
bad "topology: more than 4198400 JSON values" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/wide.json"

# Only regular files are read, bounded: /dev/zero, a FIFO, a file over the bound.
bad "topology: .*not a regular file" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology /dev/zero
mkfifo "$TMP/fifo"
bad "topology: .*not a regular file" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/fifo"
head -c 2048 /dev/zero >"$TMP/big.json"
MESHCAST_MAX_INPUT_FILE_BYTES=1024 bad "topology size: 2048 exceeds the limit of 1024" \
  "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/big.json"
MESHCAST_MAX_PLAN_OPS=lots bad MESHCAST_MAX_PLAN_OPS "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R
# The output path is checked before any work: an unwritable --svg fails at once, with status 4.
STATUS=4 bad "svg: cannot write /nonexistent-dir/x.svg" "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:S0R \
  --svg /nonexistent-dir/x.svg --iters 1000000

# What was printed must reach stdout: a full device is status 4 naming stdout, for every
# command (only plan --json checked it).
for cmd in "plan" "plan --json" "reshard --json --iters 1" "simulate --json"; do
  # shellcheck disable=SC2086
  timeout "$LIMIT" "$MC" $cmd "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:RS0 >/dev/full 2>"$TMP/err"
  rc=$?
  if [[ $rc -eq 4 && $(wc -l <"$TMP/err") -eq 1 ]]; then ok; else
    bad_result "$cmd >/dev/full: rc=$rc $(head -c 300 "$TMP/err")"; fi
done
# A FIFO as --svg is written once: its reader gets the picture (the check opened and closed
# it, which its reader took for the end, and the write then waited for ever).
mkfifo "$TMP/fifo.svg"
cat "$TMP/fifo.svg" >"$TMP/from-fifo.svg" &
reader=$!
run plan "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:RS0 --svg "$TMP/fifo.svg"
wait "$reader"
if [[ $rc -eq 0 ]] && grep -q "</svg>" "$TMP/from-fifo.svg"; then ok; else
  bad_result "plan --svg FIFO: rc=$rc $(head -c 300 "$TMP/err")"; fi
# One that no process reads: status 4 after 10 s, not a command blocked for ever. A socket,
# which also cannot be opened (ENXIO), fails at once, not after that wait.
STATUS=4 CMD=plan bad "svg: cannot write $TMP/fifo.svg: a FIFO that no process opened for reading within 10 s" \
  "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:RS0 --svg "$TMP/fifo.svg"
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$TMP/sock.svg"
t0=$(date +%s)
STATUS=4 CMD=plan bad "svg: cannot write $TMP/sock.svg: No such device or address" \
  "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:RS0 --svg "$TMP/sock.svg"
[[ $(($(date +%s) - t0)) -lt 5 ]] && ok || bad_result "--svg SOCKET waited as for a FIFO"

# ---- limits: every bound asked to exceed itself is refused at once, in bounded memory --------
# peak_kib COMMAND...: runs it (stdout/stderr/rc as run()), sets $kib to its peak RSS in KiB.
peak_kib() {
  kib=$(python3 -c '
import resource, subprocess, sys
tmp, limit, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
with open(tmp + "/out", "wb") as o, open(tmp + "/err", "wb") as e:
    try:
        rc = subprocess.run(cmd, stdout=o, stderr=e, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        rc = 124
open(tmp + "/rc", "w").write(str(rc))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
' "$TMP" "$LIMIT" "$@")
  rc=$(cat "$TMP/rc")
}
# limit_case WANT STATUS MAX_KIB ARGS...: status, one line naming WANT, peak RSS under MAX_KIB.
limit_case() {
  local want=$1 status=$2 max=$3
  shift 3
  peak_kib "$MC" "$@"
  if [ "$rc" -eq "$status" ] && { [ -z "$want" ] || grep -q -- "$want" "$TMP/err"; } && [ "$kib" -lt "$max" ]; then ok
  else bad_result "limit ($want): $* -> rc=$rc, peak ${kib} KiB (bound $max), $(head -c 300 "$TMP/err")"; fi
}
R65K=(--shape 1 --dtype f32 --src 65536@0-65535:R --dst 65536@65536-131071:R)
# auto prices the strategies without building them and builds sendrecv (one send per receiver,
# in parallel) under search: a box's candidate senders are one list its transfers share (the
# estimate had a copy per transfer, 68 GB, and took the local rule), and greedy prices a window
# of them past its budget (all 65,536 for each of 65,536 receivers would take minutes).
# allgather is refused before planning (its forwards list every receiver: quadratic).
limit_case "" 0 262144 plan "${R65K[@]}"
if grep -q "strategy sendrecv, balance search" "$TMP/out"; then ok; else bad_result "65536 R>R auto: $(head -3 "$TMP/out")"; fi
limit_case "" 0 262144 plan "${R65K[@]}" --strategy sendrecv --balance greedy
limit_case "plan memory: .* exceeds the limit" 2 200000 plan "${R65K[@]}" --strategy allgather
limit_case "local devices: 4096 exceeds the limit of 1024" 2 200000 \
  reshard --shape 4096,4096 --dtype f32 --src 4096@0-4095:S0R --dst 4096@4096-8191:RS0
MESHCAST_MAX_PLAN_OPS=100 limit_case "plan ops: .* exceeds the limit of 100" 2 200000 \
  plan --shape 64,64 --dtype f32 --src 64@0-63:S0R --dst 64@64-127:RS0
MESHCAST_MAX_SIMULATE_WORK=100 limit_case "simulate work: .* exceeds the limit of 100" 2 200000 \
  simulate --shape 256,256 --dtype f32 --src 16x16@0-255:S0S1 --dst 16x16@256-511:S1S0
# simulate's memory (its flows' link entries, the plan held beside them) is bounded with the
# plan's before any flow is built: this plan fits 30 MiB, its simulation with it does not.
MESHCAST_MAX_PLAN_MEMORY_BYTES=30M limit_case "simulate memory: .* exceeds the limit of 31457280" 2 60000 \
  simulate --shape 65536 --dtype f32 --src 1024:S0 --dst 1024:R --strategy broadcast
# And every structure of it counts, the plan's own as the heap holds it: a dense move of a
# million ops, whose estimate left out the per-op times, the per-phase lists and the heap's
# share of each op's small vectors, passed a bound of 300 MiB and peaked at 415 MiB. Refused
# there; within 460 MiB it runs, its peak RSS within a quarter more than the bound (the process
# itself, the heap's free pieces).
T1K=(--shape 2048,2048 --dtype f32 --src 1024:S0R --dst 1024@1024-2047:RS0 --balance none
     --strategy broadcast --topology cluster-1024x8)
MESHCAST_MAX_PLAN_MEMORY_BYTES=300M limit_case "simulate memory: .* exceeds the limit of 314572800" \
  2 307200 simulate "${T1K[@]}"
MESHCAST_MAX_PLAN_MEMORY_BYTES=460M limit_case "" 0 588800 simulate "${T1K[@]}"
MESHCAST_MAX_BUFFER_BYTES=100 limit_case "buffer bytes: .* exceeds the limit of 100" 2 200000 \
  reshard "${S[@]}" --src 2x2@0-3:S0R --dst 4@0-3:RS0
# A plan's links are sized by the hosts it uses, not by its topology's: a 32-byte move on 2^20
# hosts x 256 NICs took 12.6 GB and 22 s.
printf '%s' '{"name": "wide", "links": {"intra": {"bandwidth_gbyte_s": 10, "latency_us": 1},
  "network": {"bandwidth_gbit_s": 10, "latency_us": 5, "nics_per_host": 256}},
  "uniform": {"hosts": 1048576, "devices_per_host": 1}}' >"$TMP/wide.json"
limit_case "" 0 200000 simulate --shape 8 --dtype f32 --src 1@0:R --dst 1@1048575:R --topology "$TMP/wide.json"
grep -q "host host1048575 nic 0 in" "$TMP/out" && ok || bad_result "wide topology: $(head -c 400 "$TMP/out")"
# And the hosts a plan spans count against its memory bound: a broadcast to 2^20 devices on as
# many hosts, estimated at 472 MiB, peaked at 759 MiB (under a bound of 600 MiB).
printf '%s' '{"name": "h1", "links": {"intra": {"bandwidth_gbyte_s": 300, "latency_us": 3},
  "network": {"bandwidth_gbit_s": 200, "latency_us": 5}},
  "uniform": {"hosts": 1048576, "devices_per_host": 1}}' >"$TMP/h1.json"
H1=(plan --shape 1048576 --dtype f32 --src 1@0:R --dst 1048575@1-1048575:R --topology "$TMP/h1.json")
MESHCAST_MAX_PLAN_MEMORY_BYTES=600M limit_case "plan memory: an estimated 696.00 MiB .* exceeds the limit of 600.00 MiB" \
  2 200000 "${H1[@]}"
# simulate's work is its flows' link entries (a chain's grow with its receivers): 1,024 chains
# of 4,096 receivers each, some 600 events, are far over 10^8 of them (counted as flows, 6e5).
MESHCAST_MAX_SIMULATE_WORK=100000000 limit_case "simulate work: .* exceeds the limit of 100000000" 2 400000 \
  simulate --shape 3,5,7,9,11,13,15,17,19,21 --dtype f32 --src 2x2x2x2x2x2x2x2x2x2@0-1023:S0S1S2S3S4S5S6S7S8S9 \
  --dst 4096@1024-5119:RRRRRRRRRR --strategy broadcast
# And the rate sharing's heap over the links the flows touch counts: a transpose's 8,192 ports
# are 8,192 entries but 14 heap steps each (counted as entries alone, a 16,256-device transpose
# ran 3 minutes before its refusal; now 30 s).
MESHCAST_MAX_SIMULATE_WORK=50000 limit_case "simulate work: 122880 exceeds the limit of 50000" 2 200000 \
  simulate --shape 4096,4096 --dtype f32 --src 64x64:S0S1 --dst 64x64@4096-8191:S1S0
# A flow starved by rounding moves at a floor below its slowest link, not its first's: with a
# port 10^9 times faster than the network the floor outran the link bound.
printf '%s' '{"name": "skew", "links": {"intra": {"bandwidth_gbyte_s": 1e5, "latency_us": 1},
  "network": {"bandwidth_gbit_s": 1e-5, "latency_us": 1}},
  "hosts": [{"devices": [0, 1, 2, 3]}, {"devices": [4, 5, 6, 7]}]}' >"$TMP/skew.json"
run simulate --shape 4096 --dtype f32 --src 1@0:R --dst 1@4:R --topology "$TMP/skew.json" --json
if python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))
sys.exit(not j["simulated_seconds"] >= 0.999 * j["bound_seconds"] > 13)' "$TMP/out"; then ok
else bad_result "skewed links: $(head -c 400 "$TMP/out")"; fi
# Byte counts past 2^63 - 1 are refused, not printed negative.
limit_case "shape: the plan moves more than 2^63 - 1 bytes" 2 200000 \
  plan --shape 9223372036854775807 --dtype i8 --src 1@0:R --dst 4@1-4:R --strategy sendrecv
# Iterations are bounded by what they move in all: a run of hours is refused before it starts.
limit_case "run bytes: 100000 iterations and the warm-up, each of .*, exceed the limit of 4.00 TiB" 2 200000 \
  reshard --shape 4096,4096 --dtype f64 --src 2x2@0-3:S0S1 --dst 4@4-7:S0R --iters 100000
limit_case "run bytes: 1000000 iterations" 2 200000 demo --iters 1000000
MESHCAST_MAX_RUN_BYTES=1M limit_case "" 0 200000 \
  reshard --shape 64,64 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:S0R --iters 10
# Iterations on the local backend hold no memory of their own: each left an empty queue per
# pair of devices and tag behind (300 of this all-to-all of 16 x 16 pairs grew to 200 MB, and
# 65,536 of them, within every bound above, to 38 GB).
limit_case "" 0 100000 reshard --shape 16,16 --dtype f32 --src 16@0-15:S0R --dst 16@16-31:RS0 \
  --strategy sendrecv --iters 300
# A sum of 16 addends: its reduces' roots stage the 15 others (3.75 MiB beside 8 MiB of tiles).
MESHCAST_MAX_BUFFER_BYTES=10M limit_case "buffer bytes: .* the limit of 10.00 MiB" 2 200000 \
  reshard --shape 256,256 --dtype f32 --src 16:RR+P0 --dst 16:RR
MESHCAST_MAX_BUFFER_BYTES=12M limit_case "" 0 200000 \
  reshard --shape 256,256 --dtype f32 --src 16:RR+P0 --dst 16:RR --verify
# A picture of 1,024 devices (all-to-all) is aggregated: bounded in elements, and says so.
limit_case "" 0 1000000 plan --shape 1024,64 --dtype f32 --src 512@0-511:S0R \
  --dst 512@512-1023:RS0 --strategy broadcast --balance greedy --svg "$TMP/big.svg"
if grep -q "consecutive devices" "$TMP/big.svg" && python3 -c '
import xml.etree.ElementTree as E, sys
sys.exit(not len(list(E.parse(sys.argv[1]).getroot().iter())) <= 20000)' "$TMP/big.svg"; then ok
else bad_result "aggregated svg: $(grep -c . "$TMP/big.svg") lines, $(stat -c %s "$TMP/big.svg") bytes"; fi

# plan refuses the same inputs the same way.
run plan --shape 8,8 --dtype f32 --src 2x2@0-4:S0R --dst 4@0-3:S0R --json
if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q src.mesh "$TMP/err"; then ok
else bad_result "plan with a bad mesh: rc=$rc $(cat "$TMP/err")"; fi
run plan --shape 8,8 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --svg /nonexistent-dir/x.svg
if [ "$rc" -eq 4 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q svg "$TMP/err"; then ok
else bad_result "plan --svg to an unwritable path: rc=$rc $(cat "$TMP/err")"; fi
run
if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ]; then ok
else bad_result "no subcommand: rc=$rc $(cat "$TMP/err")"; fi
run frobnicate
if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ]; then ok
else bad_result "unknown subcommand: rc=$rc $(cat "$TMP/err")"; fi

# A local world whose threads cannot all start (address space for their stacks): one line,
# status 1, the started devices ended (no abort). Not under a sanitizer, whose shadow memory
# needs more address space than the limit. OpenBLAS (under ScaLAPACK) keeps no threads of its
# own: one that has not yet mapped its buffer retries the mmap for ever at exit once the address
# space is spent (about 1 run in 6 hung in blas_thread_shutdown).
if ! nm -D "$MC" 2>/dev/null | grep -qE "__(asan|tsan)_init"; then
  (
    ulimit -v 1000000
    OPENBLAS_NUM_THREADS=1 timeout "$LIMIT" "$MC" reshard --shape 1024 --dtype f32 --src 512:S0 --dst 512@512-1023:S0 \
      --iters 1 >"$TMP/out" 2>"$TMP/err"
  )
  rc=$?
  if [ "$rc" -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "cannot start device" "$TMP/err"
  then ok; else bad_result "local world out of threads: rc=$rc $(head -c 300 "$TMP/err")"; fi
fi

# ---- plan --json and --svg -----------------------------------------------------------------
run plan --shape 64,64 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0 --json --svg "$TMP/plan.svg"
if [ "$rc" -eq 0 ] && python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$TMP/out" &&
  python3 -c 'import xml.etree.ElementTree as E,sys; r=E.parse(sys.argv[1]).getroot(); assert r.tag.endswith("svg")' "$TMP/plan.svg"; then ok
else bad_result "plan --json --svg: rc=$rc $(head -c 300 "$TMP/err")"; fi

for st in broadcast sendrecv allgather; do
  for c in "${GOOD_CASES[@]}"; do
    # shellcheck disable=SC2086
    run plan $c --strategy $st --svg "$TMP/p.svg"
    if [ "$rc" -eq 0 ] && python3 -c 'import xml.etree.ElementTree as E,sys; E.parse(sys.argv[1])' "$TMP/p.svg" &&
      grep -q "strategy" "$TMP/out"; then ok
    else bad_result "plan $c --strategy $st --svg: rc=$rc $(head -c 300 "$TMP/err")"; fi
  done
done

# Text that needs escaping in the SVG (the topology name) stays well-formed XML.
printf '{"name": "a<b>&\\"c\\"", "links": {"intra": {"bandwidth_gbyte_s": 1, "latency_us": 1}}, "single_host": true}' >"$TMP/esc.json"
run plan --shape 8,8 --dtype f32 --src 2x2@0-3:S0R --dst 4@0-3:S0R --topology "$TMP/esc.json" --svg "$TMP/esc.svg"
if [ "$rc" -eq 0 ] && python3 -c 'import xml.etree.ElementTree as E,sys; E.parse(sys.argv[1])' "$TMP/esc.svg"; then ok
else bad_result "svg escaping: rc=$rc $(head -c 300 "$TMP/err")"; fi

# ---- shipped topology files ----------------------------------------------------------------
for f in meshes/*.json; do
  run plan --shape 64,64 --dtype f32 --src 2x2@0-3:S0R --dst 2x2@[3,2,1,0]:RS0 --topology "$f" --json
  name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$f")
  if [ "$rc" -eq 0 ] && [ "$(json_field topology)" = "\"$name\"" ]; then ok
  else bad_result "plan --topology $f: rc=$rc topology=$(json_field topology) $(head -c 300 "$TMP/err")"; fi
done

# ---- simulate, and plan --json's cost ---------------------------------------------------------
# One sender to 8 devices on 4 other hosts of the emulated cluster: sendrecv crosses the
# sender's link once per receiver, broadcast once; the simulation is never below the link bound.
ONE_TO_8=(--shape 16777216 --dtype f32 --src 1@0:R --dst "4x2@[4,5,8,9,12,13,16,17]:R"
  --topology meshes/emulated.json)
declare -A SIM
for st in sendrecv broadcast; do
  run simulate "${ONE_TO_8[@]}" --strategy "$st" --json
  read -r p s b n < <(json_field predicted_seconds simulated_seconds bound_seconds links)
  SIM[$st]=$s
  if [ "$rc" -eq 0 ] && [ "$n" != MISSING ] && python3 -c "import sys; p,s,b=map(float,sys.argv[1:]); sys.exit(not (0<b<=s*(1+1e-9) and b<=p*(1+1e-9)))" "$p" "$s" "$b"; then ok
  else bad_result "simulate --strategy $st: rc=$rc predicted=$p simulated=$s bound=$b $(head -c 300 "$TMP/err")"; fi
done
if python3 -c "import sys; sys.exit(not float(sys.argv[1]) > 6 * float(sys.argv[2]))" "${SIM[sendrecv]}" "${SIM[broadcast]}"; then ok
else bad_result "simulate: sendrecv ${SIM[sendrecv]} s not > 6x broadcast ${SIM[broadcast]} s for 8 receivers"; fi
run simulate "${ONE_TO_8[@]}"
if [ "$rc" -eq 0 ] && grep -q "simulated" "$TMP/out" && grep -q "host mc-host0 out" "$TMP/out"; then ok
else bad_result "simulate (text): rc=$rc $(head -c 300 "$TMP/out" "$TMP/err")"; fi
run plan "${ONE_TO_8[@]}" --strategy sendrecv --json
if [ "$rc" -eq 0 ] && python3 - "$TMP/out" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read())
c = j["cost"]
out = [l for l in c["links"] if l["link"] == "host mc-host0 out"]
# The sender's host link carries the tensor once per receiver (8 x 64 MiB).
assert out and out[0]["bytes"] == 8 * 4 * 16777216 and out[0]["class"] == "network", out
assert c["predicted_seconds"] == j["stats"]["predicted_seconds"]
assert abs(c["bound_seconds"] - max(l["seconds"] for l in c["links"])) < 1e-12
EOF
then ok; else bad_result "plan --json cost: rc=$rc $(head -c 300 "$TMP/err")"; fi

# ---- saved plans: reshard --plan FILE runs what plan --json wrote, checked against the options --
run plan --shape 8,6 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0 --strategy sendrecv --json
cp "$TMP/out" "$TMP/saved.json"
run reshard --plan "$TMP/saved.json" --verify --json --iters 2
read -r v st < <(json_field verified strategy)
if [ "$rc" -eq 0 ] && [ "$v" = true ] && [ "$st" = '"sendrecv"' ]; then ok
else bad_result "reshard --plan: rc=$rc verified=$v strategy=$st $(head -c 300 "$TMP/err")"; fi
run reshard --plan "$TMP/saved.json" --shape 8,6 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0 --verify
if [ "$rc" -eq 0 ] && grep -q "yes, 0 mismatches" "$TMP/out"; then ok
else bad_result "reshard --plan with its own layouts: rc=$rc $(head -c 300 "$TMP/err")"; fi
bad "shape: .*moves 8,6, not 8,7" --plan "$TMP/saved.json" --shape 8,7
bad "dtype: .*moves f32, not f64" --plan "$TMP/saved.json" --dtype f64
bad "dst: .*moves 4@4-7:RS0, not 4@4-7:S0R" --plan "$TMP/saved.json" --dst 4@4-7:S0R
bad "strategy: the saved plan" --plan "$TMP/saved.json" --strategy broadcast
bad "topology: the saved plan" --plan "$TMP/saved.json" --topology dgx-a100
# The topology it was made on, named again, changes nothing.
run plan --shape 8,6 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0 --topology aws-p3.8xlarge --json
cp "$TMP/out" "$TMP/saved-aws.json"
run reshard --plan "$TMP/saved-aws.json" --topology aws-p3.8xlarge --verify
if [ "$rc" -eq 0 ] && grep -q "yes, 0 mismatches" "$TMP/out"; then ok
else bad_result "reshard --plan with its own topology: rc=$rc $(head -c 300 "$TMP/err")"; fi
bad "shape: required" --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0
# A 0-d tensor's saved plan (shape [], as Python writes it) runs with its own layouts, in either
# spelling of its spec.
run plan --shape 1 --dtype f32 --src 2@0-1:R --dst 3@0-2:R --json
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["src"]["shape"]=j["dst"]["shape"]=[]
json.dump(j, open(sys.argv[2], "w"))' "$TMP/out" "$TMP/scalar.json"
for src in 2@0-1: 2@0-1:R; do
  run reshard --plan "$TMP/scalar.json" --src "$src" --dst 3@0-2: --verify
  if [ "$rc" -eq 0 ] && grep -q "yes, 0 mismatches" "$TMP/out"; then ok
  else bad_result "reshard --plan of a 0-d tensor --src $src: rc=$rc $(head -c 300 "$TMP/err")"; fi
done
# A saved plan's byte counts are its ops': the run bound and the bandwidth are taken from them.
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["stats"]["bytes_moved"]=1
json.dump(j, open(sys.argv[2], "w"))' "$TMP/saved.json" "$TMP/understated.json"
bad "plan.stats.bytes_moved: says 1 where the ops give" --plan "$TMP/understated.json"
printf '{"src": "2@0-1:S0"}' >"$TMP/notaplan.json"
bad "plan" --plan "$TMP/notaplan.json"
STATUS=4 bad "plan: cannot read" --plan "$TMP/absent.json"

# ---- honest text: op names and plurals, simulate --svg ------------------------------------------
run plan --shape 8 --dtype f32 --src 1@0:R --dst 1@1:R
if [ "$rc" -eq 0 ] && grep -q ", 1 op in 1 phase$" "$TMP/out" && grep -q "^  \[0\] send  *\[0:8\] 0 -> 1$" "$TMP/out"; then ok
else bad_result "plan of one send: $(head -c 400 "$TMP/out")"; fi
run plan --shape 8 --dtype f32 --src 1@0:R --dst 2@1-2:R --strategy broadcast
if grep -q ", 1 op in 1 phase$" "$TMP/out" && grep -q "multicast .*0 -> 1,2$" "$TMP/out"; then ok
else bad_result "plan of one multicast: $(head -c 400 "$TMP/out")"; fi
run simulate --shape 8 --dtype f32 --src 1@0:R --dst 1@1:R --svg "$TMP/sim.svg"
if [ "$rc" -eq 0 ] && grep -q "1 op in 1 phase over 2 devices" "$TMP/out" &&
  python3 -c 'import xml.etree.ElementTree as E,sys; E.parse(sys.argv[1])' "$TMP/sim.svg"; then ok
else bad_result "simulate --svg: rc=$rc $(head -c 300 "$TMP/out") $(head -c 300 "$TMP/err")"; fi

# ---- log levels: --quiet and --log-level, before or after the command --------------------------
run train gpt --steps 2 --batch 4 --seq 8 --d-model 16 --layers 1 --heads 2 --data random \
  --out "$TMP/q" --quiet
if [ "$rc" -eq 0 ] && ! grep -q "^step\|^gpt:" "$TMP/out" && grep -q "^final loss" "$TMP/out" &&
  [ ! -s "$TMP/err" ]; then ok
else bad_result "train --quiet: rc=$rc $(head -c 300 "$TMP/out")"; fi
run --log-level warn train gpt --steps 2 --batch 4 --seq 8 --d-model 16 --layers 1 --heads 2 \
  --data random --out "$TMP/q" --checkpoint-dir "$TMP/q/none" --resume
if [ "$rc" -eq 0 ] && ! grep -q "^step" "$TMP/out" &&
  grep -q "^meshcast: warning: --resume: .* holds no checkpoint; starting at step 0$" "$TMP/err"; then ok
else bad_result "--log-level warn: rc=$rc $(head -c 300 "$TMP/out") $(head -c 300 "$TMP/err")"; fi
CMD=plan bad "log-level: expected error, warn or info, got 'loud'" "${S[@]}" --src 2@0-1:S0R \
  --dst 2@2-3:RS0 --log-level loud
# Typed numbers in the help, and --config keys that the model takes.
run train gpt --help
if grep -q -- "--steps INT=300" "$TMP/out" && grep -q -- "--lr FLOAT=" "$TMP/out" &&
  grep -q "seed, data, eval_every" "$TMP/out" && ! grep -q "noise" "$TMP/out"; then ok
else bad_result "train gpt --help: $(grep -e --steps -e --config "$TMP/out")"; fi
run train utransformer --help
if grep -q "seed, noise, eval_every" "$TMP/out" && ! grep -q -- "--data" "$TMP/out"; then ok
else bad_result "train utransformer --help: $(grep -e --config "$TMP/out")"; fi

# ---- demo ----------------------------------------------------------------------------------
run demo
if [ "$rc" -eq 0 ] && grep -q "all cases verified" "$TMP/out" && grep -q "bytes crossing hosts" "$TMP/out"; then ok
else bad_result "demo: rc=$rc $(head -c 300 "$TMP/err")"; fi
# The demo's built-in cluster is meshes/aws-p3.8xlarge.json: the same plans and byte counts.
grep -v -e "^run:" -e "^topology" "$TMP/out" >"$TMP/demo.builtin"
run demo --topology meshes/aws-p3.8xlarge.json
grep -v -e "^run:" -e "^topology" "$TMP/out" >"$TMP/demo.file"
if [ "$rc" -eq 0 ] && diff -q "$TMP/demo.builtin" "$TMP/demo.file" >/dev/null; then ok
else bad_result "demo built-in topology differs from meshes/aws-p3.8xlarge.json: $(diff "$TMP/demo.builtin" "$TMP/demo.file" | head -5)"; fi
run demo --iters 0
if [ "$rc" -eq 2 ] && grep -q iters "$TMP/err"; then ok; else bad_result "demo --iters 0: rc=$rc"; fi

# ---- help ----------------------------------------------------------------------------------
for cmd in "" plan reshard simulate demo; do
  # shellcheck disable=SC2086
  run $cmd --help
  if [ "$rc" -eq 0 ] && [ -s "$TMP/out" ]; then ok; else bad_result "$cmd --help: rc=$rc"; fi
done
# Help that did not reach stdout is an I/O failure (status 4), as any output is.
for args in "--help" "--version" "plan --help"; do
  # shellcheck disable=SC2086
  timeout "$LIMIT" "$MC" $args >/dev/full 2>"$TMP/err"
  rc=$?
  if [ "$rc" -eq 4 ] && grep -q "stdout" "$TMP/err"; then ok; else bad_result "$args >/dev/full: rc=$rc"; fi
done
run reshard --help
if grep -q -- "--verify" "$TMP/out" && grep -q -- "--backend" "$TMP/out" && grep -q "mismatches" "$TMP/out"; then ok
else bad_result "reshard --help lacks --verify/--backend/mismatches"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
