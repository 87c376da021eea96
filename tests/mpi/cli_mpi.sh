#!/usr/bin/env bash
# `meshcast reshard --backend mpi|ucx` under mpirun: verified results, one JSON object from rank
# 0 only, and bad input across ranks refused with exit status 2 rather than a hang.
# Usage: cli_mpi.sh MESHCAST MPIEXEC
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mc=$1
run=("$2" --allow-run-as-root --oversubscribe --mca btl self,vader)
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

for backend in mpi ucx; do
  for args in "--shape 64,48 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0" \
              "--shape 9,5,3 --dtype bf16 --src 2x2@[3,1,2,0]:S0RR+P1 --dst 2x4@0-7:RS1S0" \
              "--shape 33 --dtype i64 --src 1@5:R --dst 2x3@0-5:S0" \
              "--shape 512,384 --dtype f32 --src 2@0-1:RS0 --dst 3x2@2-7:RS0"; do
    # (the last: boxes of 128 KiB strided on both sides, which transports split into fragments)
    for strategy in broadcast sendrecv allgather; do
      # shellcheck disable=SC2086
      out=$(timeout 120 "${run[@]}" -np 8 "$mc" reshard $args --strategy $strategy \
            --backend $backend --iters 2 --verify --json 2>/dev/null)
      rc=$?
      lines=$(printf '%s\n' "$out" | grep -c '^{')
      verified=$(printf '%s\n' "$out" | python3 -c 'import json,sys
print(json.loads(sys.stdin.readline()).get("verified"))' 2>/dev/null)
      if [[ $rc -eq 0 && $lines -eq 1 && $verified == True ]]; then ok; else
        bad "$backend $strategy $args: rc=$rc json-lines=$lines verified=$verified"; fi
    done
  done
done

# Too few ranks for the meshes' device ids.
err=$(timeout 120 "${run[@]}" -np 2 "$mc" reshard --shape 8 --dtype f32 --src 4@0-3:S0 \
      --dst 4@4-7:S0 --backend mpi --verify 2>&1 >/dev/null)
rc=$?
if [[ $rc -eq 2 ]] && grep -q "backend: the meshes use device ids up to 7" <<<"$err"; then ok; else
  bad "too few ranks: rc=$rc: $err"; fi
# The largest id, 2^31 - 1: the count of ranks it needs does not fit an int (it wrapped, and the
# check passed).
err=$(timeout 120 "${run[@]}" -np 1 "$mc" reshard --shape 8 --dtype f32 --src 1@0:S0 \
      --dst "2@[0,2147483647]:R" --backend mpi 2>&1 >/dev/null)
rc=$?
if [[ $rc -eq 2 ]] && grep -q "must start at least 2147483648 ranks (it started 1)" <<<"$err"; then ok
else bad "id 2^31 - 1: rc=$rc: $err"; fi

# A plan of more streams than the group's run of tags (65,536 here) reuses them: device 1
# forwards the chain of stream 0 to device 2 as its chunks arrive, after its direct send of a
# later op on the same tag went out (the run's tags but the words' wrap every 65,535 streams; the
# old wrap was 65,536). That send took the chain's receive: every element swapped, reported ok.
plans=$(mktemp -d)
"$mc" plan --shape 512 --dtype f32 --src "2@[0,1]:R" --dst "2@[1,2]:R" --strategy broadcast \
  --json > "$plans/q.json"
for wrap in 65535 65536; do
  python3 - "$plans/q.json" "$wrap" "$plans/$wrap.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
n, k, w = 512, 256, int(sys.argv[2])
d["ops"] = [  # the chain 0 -> 1 -> 2 of [0, k), and 1 -> 2 of [k, n) on a stream w later
    {"kind": "multicast", "phase": 0, "box": [[0, k]], "root": 0, "peers": [1, 2],
     "from_dst": False, "stream": 0},
    {"kind": "multicast", "phase": 0, "box": [[k, n]], "root": 1, "peers": [2],
     "from_dst": False, "stream": w},
    {"kind": "copy", "phase": 0, "box": [[k, n]], "root": 1, "peers": [], "from_dst": False,
     "stream": 0}]
d["streams"] = 70000
s = d["stats"]
s.update(bytes_moved=k * 4 * 2 + (n - k) * 4, bytes_local=(n - k) * 4,
         sent={"0": k * 4, "1": k * 4 + (n - k) * 4}, received={"1": k * 4, "2": n * 4})
s["bytes_intra_host"] = s["bytes_moved"]
json.dump(d, open(sys.argv[3], "w"))
PY
  for backend in mpi ucx; do
    out=$(timeout 120 "${run[@]}" -np 3 "$mc" reshard --plan "$plans/$wrap.json" --backend $backend \
          --iters 1 --verify --json 2>&1)
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q '"mismatches":0' <<<"$out"; then ok; else
      bad "tags reused after $wrap streams on $backend: rc=$rc: $out"; fi
  done
done
rm -rf "$plans"

# Ranks given different layouts: detected before any transfer.
err=$(timeout 120 "${run[@]}" -np 2 "$mc" reshard --shape 8 --dtype f32 --src 2@0-1:S0 \
      --dst 2@0-1:R --backend mpi --verify : -np 2 "$mc" reshard --shape 8 --dtype f32 \
      --src 2@0-1:R --dst 2@0-1:S0 --backend mpi --verify 2>&1 >/dev/null)
rc=$?
if [[ $rc -eq 2 ]] && grep -q "plan: ranks 2,3 were started with a different plan" <<<"$err"; then ok; else
  bad "disagreeing ranks: rc=$rc: $err"; fi

# A rank that never starts MPI (it died before MPI's start, under --enable-recovery): the others,
# waiting in the launcher for it, say so and exit 3 within the rendezvous timeout (they waited
# for ever). Rank 1 ends once they have (files, not a sleep a busy machine outlasts).
tmp=$(mktemp -d)
out=$(timeout 120 "${run[@]}" --enable-recovery -x MESHCAST_RENDEZVOUS_TIMEOUT=3 -np 3 bash -c \
  "r=\$OMPI_COMM_WORLD_RANK
   if [[ \$r == 1 ]]; then
     for ((i = 0; i < 600; ++i)); do [[ -e $tmp/gone.0 && -e $tmp/gone.2 ]] && break; sleep 0.1; done
     exit 0
   fi
   $(readlink -f "$mc") reshard --shape 8 --dtype f32 --src 3@0-2:S0 --dst 3@0-2:R --backend mpi
   s=\$?; touch $tmp/gone.\$r; echo status \$s" 2>&1)
rc=$?
rm -rf "$tmp"
n=$(grep -c "^meshcast: mpi: MPI did not start within 3 s" <<<"$out")
st=$(grep -c "^status 3$" <<<"$out")
if [[ $rc -ne 124 && $n -eq 2 && $st -eq 2 ]]; then ok
else bad "a rank that never starts MPI: rc=$rc, $n said so, $st exited 3: $out"; fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
