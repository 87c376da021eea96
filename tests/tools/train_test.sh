#!/usr/bin/env bash
# `meshcast train gpt`: a parallel run's losses equal the serial run's, the loss falls on the
# learnable synthetic text, --plan ranks configurations, and bad configurations exit 2 with one
# line naming the field. Usage: train_test.sh MESHCAST
set -u
mc=$1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
losses() { python3 -c 'import json,sys
print(" ".join("%.9g" % s["loss"] for s in json.loads(sys.stdin.readline())["steps"]))'; }

common=(--steps 4 --batch 8 --d-model 32 --layers 4 --heads 4 --json)
serial=$("$mc" train gpt "${common[@]}" | losses)
for stages in "dp=2" "tp=2/tp=2" "dp=2,tp=2/grid=2x1x1" "grid=1x2x2/dp=1/dp=2"; do
  for schedule in 1f1b eager-1f1b gpipe; do
    got=$("$mc" train gpt "${common[@]}" --stages "$stages" --micro-batches 2 --schedule "$schedule" | losses)
    if python3 - "$serial" "$got" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
sys.exit(0 if len(a) == len(b) == 4 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)) else 1)
PY
    then ok; else bad "$stages $schedule: losses [$got], serial [$serial]"; fi
  done
done

# The loss falls well below its start (ln 64 = 4.16) on the counting sequences.
curve=$("$mc" train gpt --steps 40 --json | losses)
if python3 -c "import sys; v=[float(x) for x in '$curve'.split()]; sys.exit(0 if v[-1] < 0.6 * v[0] else 1)"; then
  ok; else bad "loss did not fall: $curve"; fi

# Human-readable lines: one per step with the breakdown.
lines=$("$mc" train gpt --steps 3 --stages dp=1/dp=1 --micro-batches 2 | grep -c 'exposed comm')
[[ $lines -eq 3 ]] && ok || bad "expected 3 step lines, got $lines"

# --plan: the ranked configurations, best first.
out=$("$mc" train gpt --plan --devices 8 --top 3 --topology meshes/emulated.json --json)
if printf '%s\n' "$out" | python3 -c 'import json,sys
c = json.loads(sys.stdin.readline())["configurations"]
s = [x["seconds"] for x in c]
sys.exit(0 if len(c) == 3 and s == sorted(s) else 1)'; then ok; else bad "--plan: $out"; fi

# Bad input: exit 2, one line, naming the field.
expect_error() {
  local field=$1
  shift
  local err rc
  err=$("$mc" train gpt "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq 2 && $(printf '%s\n' "$err" | wc -l) -eq 1 && $err == *"$field"* ]]; then ok; else
    bad "$* -> rc=$rc: $err (wanted field $field)"; fi
}
expect_error "stages[0].cols" --stages tp=3
expect_error "stages[1].grid" --stages dp=1/grid=2x2
expect_error "schedule" --schedule sideways
expect_error "batch" --micro-batches 3
expect_error "layers" --stages dp=1/dp=1/dp=1/dp=1/dp=1
expect_error "micro_batches" --stages dp=1/dp=1 --schedule interleaved --chunks 2 --micro-batches 1
expect_error "backend" --backend carrier-pigeon
expect_error "data" --data /nonexistent
expect_error "devices" --plan --devices 0
expect_error "lr" --lr fast

echo "train_test: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
