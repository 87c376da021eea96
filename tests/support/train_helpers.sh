# Shared by tests/tools/train_test.sh and tests/mpi/train_mpi.sh (sourced): pass/fail counting
# and the losses of `meshcast train ... --json`.
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# The "loss" of every step of the JSON summary on stdin, space-separated.
losses() {
  python3 -c 'import json,sys
print(" ".join("%.9g" % s["loss"] for s in json.loads(sys.stdin.readline())["steps"]))'
}
# close "a b c" "a b c": as many losses, each within 1e-4 relative.
close() {
  python3 - "$1" "$2" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
sys.exit(0 if a and len(a) == len(b) and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)) else 1)
PY
}
# expect_exit RC NEEDLE CMD...: CMD exits with status RC and one line on stderr containing NEEDLE.
expect_exit() {
  local want=$1 needle=$2
  shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq $want && $(printf '%s\n' "$err" | wc -l) -eq 1 && $err == *"$needle"* ]]; then ok; else
    bad "$* -> rc=$rc: $err (wanted rc $want and '$needle')"; fi
}
