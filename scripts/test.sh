#!/usr/bin/env bash
# THE test command (CI runs it through .ci/run). From anywhere:
#   scripts/test.sh
# 1. scripts/setup.sh installs missing Debian packages;
# 2. presets default (Release), debug (ASan + UBSan) and tsan (ThreadSanitizer, threaded tests
#    only): configure with -DMESHCAST_WERROR=ON -DCMAKE_UNITY_BUILD=ON (a third less to compile:
#    1,695 s for this script instead of 2,040 s; the presets alone, as scripts/demo.sh and a
#    developer build, compile file by file, which is where an include a unity source hides
#    shows), build with 2 jobs, ctest --preset; debug leaves out the benchmarks and the CLI-driven
#    script tests (tools.cli_test, tools.train_test, tools.sync_test, tools.readme_test,
#    mpi.cli*, mpi.train: half of its time, over library code its suites and the fuzzers cover
#    under the sanitizers too) and package.consumer (ten sanitized builds of the install
#    checks), which Release runs; tsan builds no CLI; the sanitizer and fuzz presets build no
#    NCCL backend (its tests skip without a GPU; Release compiles it); both sanitizer presets run
#    the randomized sweeps at MESHCAST_TEST_SCALE 0.5 (debug) and 0.25 (tsan) of Release's counts;
#    tsan and fuzz keep line tables only (-g1: reports name file and line; a third less to compile);
#    after the Release ctest (whose python.pytest runs the Python suite on the build tree), the
#    Python package is installed twice outside the tree and imported from elsewhere:
#    `cmake --install --component python` (staged with DESTDIR) and
#    `pip install --no-build-isolation .` into a venv (reusing the Release build: MESHCAST_BUILD_DIR);
# 3. preset fuzz (clang), file by file (its few large unity sources took 113 s, not 61 s; named,
#    since the cache keeps a value): build the libFuzzer targets, replay their seed corpora, then fuzz each
#    one for MESHCAST_FUZZ_SECONDS seconds (default 10).
# Stops at the first failure and prints a summary either way.
# Environment: MESHCAST_PRESETS="default debug" runs a subset of the ctest presets ("none": none);
# MESHCAST_FUZZ_SECONDS=0 only replays the fuzz corpora; MESHCAST_FUZZ=0 skips the fuzz preset.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

presets=${MESHCAST_PRESETS:-default debug tsan}
[[ $presets == none ]] && presets=
fuzz_seconds=${MESHCAST_FUZZ_SECONDS:-10}
summary=()
passed=0
skipped=0
t_all=$(date +%s)

print_summary() {
  echo
  echo "=== summary ($(($(date +%s) - t_all)) s)"
  printf '  %s\n' "${summary[@]}"
}

# step NAME COMMAND...: runs a command, records its outcome and time; stops everything on failure.
step() {
  local name=$1 t0 rc=0
  shift
  echo
  echo "=== $name: $*"
  t0=$(date +%s)
  "$@" || rc=$?
  if [[ $rc -ne 0 ]]; then
    summary+=("FAIL  $name ($(($(date +%s) - t0)) s)")
    print_summary
    echo "scripts/test.sh: FAILED at '$name' (exit $rc)"
    exit "$rc"
  fi
  summary+=("ok    $name ($(($(date +%s) - t0)) s)${note:+: $note}")
  note=
}

# run_ctest PRESET: ctest, counting passed and skipped tests from its closing lines.
run_ctest() {
  local log=build/$1/ctest.log total skip
  ctest --preset "$1" 2>&1 | tee "$log" || return 1
  total=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1)
  [[ -n $total && $total -gt 0 ]] || { echo "ctest ran no test"; return 1; }
  skip=$(grep -c '(Skipped)' "$log" || true)
  passed=$((passed + total - skip))
  skipped=$((skipped + skip))
  note="$((total - skip)) passed, $skip skipped"
}

# run_fuzzers: replays each fuzzer's seeds, then fuzzes it for $fuzz_seconds seconds.
run_fuzzers() {
  local bin=build/fuzz/bin work=build/fuzz/corpus art=build/fuzz/artifacts
  local mc=build/default/bin/meshcast
  local fuzzer name seeds log count=0
  mkdir -p "$art"
  # Aborts (failed checks in the fuzz targets) get a stack trace too.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-handle_abort=1}
  for fuzzer in "$bin"/*_fuzz; do
    [[ -x $fuzzer ]] || continue
    name=$(basename "$fuzzer")
    seeds=tests/fuzz/corpus/$name
    mkdir -p "$work/$name" "$seeds"  # new inputs go to the working corpus, never to the repository
    # Real inputs of the tree make better seeds than hand-written ones.
    case $name in
      topology_fuzz) cp -f meshes/*.json "$work/$name/" 2>/dev/null || true ;;
      plan_fuzz)
        if [[ -x $mc ]]; then
          "$mc" plan --shape 8,6 --dtype f32 --src 2x2@0-3:S0S1 --dst 4@4-7:RS0 --json \
            >"$work/$name/cli-plan-1.json" 2>/dev/null || true
          "$mc" plan --shape 12,12 --dtype f32 --src 2x2@0-3:S0R+P1 --dst 2x2@0-3:RS0 --json \
            --strategy allgather >"$work/$name/cli-plan-2.json" 2>/dev/null || true
        fi ;;
    esac
    log=$art/$name.log
    echo "--- $name: replay seeds, then fuzz ${fuzz_seconds} s (log: $log)"
    if ! "$fuzzer" -runs=0 -artifact_prefix="$art/$name-" "$work/$name" "$seeds" >"$log" 2>&1 ||
       { [[ $fuzz_seconds -gt 0 ]] &&
         ! "$fuzzer" -max_total_time="$fuzz_seconds" -seed=1 -timeout=10 -rss_limit_mb=2048 \
             -max_len=4096 -print_final_stats=1 -artifact_prefix="$art/$name-" \
             "$work/$name" "$seeds" >>"$log" 2>&1; }; then
      # The report: from its first line (sanitizer, timeout, crash), then libFuzzer's last words.
      awk '/==[0-9]+==|^ALARM|runtime error|terminate called|deadly signal/ && !on {on=1} on && n++ < 60' "$log"
      echo "..."
      tail -n 8 "$log"
      echo "$name: FINDING; the input that triggered it is in $art/ (replay: $fuzzer FILE)"
      return 1
    fi
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done)' "$log" || true
    count=$((count + 1))
  done
  [[ $count -gt 0 ]] || { echo "no fuzzers in $bin"; return 1; }
  passed=$((passed + count))
  note="$count fuzzers clean"
}

# check_python_install: the package from `cmake --install` and from pip, imported outside the
# tree, finds its presets and moves data.
check_python_install() {
  local build=$PWD/build/default stage=$PWD/build/default/stage venv=$PWD/build/default/venv site
  local probe='import meshcast as mc, numpy as np, sys
assert not mc.__file__.startswith(sys.argv[1] + "/python"), mc.__file__
t = mc.Topology("dgx-a100")
s, d = mc.Layout((6, 4), "f32", "2:S0R"), mc.Layout((6, 4), "f32", "2:RS0")
p = mc.plan(s, d, t)
f = np.arange(24, dtype=np.float32).reshape(6, 4)
def go(c):
    b = np.empty(d.local_shape(c.rank), np.float32)
    mc.reshard(p, c, f[s.local_box(c.rank)].copy(), b)
    return bool((b == f[d.local_box(c.rank)]).all())
assert mc.LocalWorld(2).run(go) == [True, True]
print("imported", mc.__file__)'
  rm -rf "$stage" "$venv"
  DESTDIR=$stage cmake --install "$build" --component python >/dev/null
  site=$(dirname "$(find "$stage" -type d -name meshcast -path '*-packages/*' | head -n 1)")
  (cd /tmp && PYTHONPATH=$site /usr/bin/python3 -c "$probe" "$build") || return 1
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  MESHCAST_BUILD_DIR=$build "$venv/bin/pip" install --no-build-isolation --no-deps --no-index \
    -q . || return 1
  (cd /tmp && "$venv/bin/python" -c "$probe" "$build") || return 1
  note="cmake --install and pip install import and run"
}

note=
step setup bash scripts/setup.sh
for preset in $presets; do
  step "$preset: configure" cmake --preset "$preset" -DMESHCAST_WERROR=ON -DCMAKE_UNITY_BUILD=ON
  step "$preset: build" cmake --build --preset "$preset" -j 2
  step "$preset: ctest" run_ctest "$preset"
  [[ $preset == default ]] && step "python: install" check_python_install
done
if [[ ${MESHCAST_FUZZ:-1} != 0 ]]; then
  step "fuzz: configure" cmake --preset fuzz -DMESHCAST_WERROR=ON -DCMAKE_UNITY_BUILD=OFF
  step "fuzz: build" cmake --build --preset fuzz -j 2
  step "fuzz: run" run_fuzzers
fi

print_summary
echo "scripts/test.sh: all steps passed"
echo "total: $passed passed, 0 failed, $skipped skipped"
