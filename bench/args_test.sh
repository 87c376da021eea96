#!/usr/bin/env bash
# Every bench program parses its arguments with bench/args.h: --help lists its options and exits
# 0; an unknown option or a bad value is one line on stderr naming the option, exit status 2,
# before any work (the MPI programs before MPI starts, so no mpirun is needed here).
#   bench/args_test.sh BIN_DIR   (the build's bin/, holding the bench programs that were built)
set -uo pipefail
bin=${1:?usage: args_test.sh BIN_DIR}
fails=0 checked=0

# expect PROGRAM STATUS PATTERN ARGS...: PROGRAM ARGS exits STATUS, and its stderr is one line
# matching PATTERN (STATUS 0: its stdout starts with "usage:").
expect() {
  local prog=$1 want=$2 pattern=$3
  shift 3
  local err out rc
  err=$(mktemp)
  out=$(MESHCAST_BENCH_SMOKE=1 timeout 60 "$bin/$prog" "$@" 2>"$err")
  rc=$?
  checked=$((checked + 1))
  if [[ $rc != "$want" ]]; then
    echo "FAIL: $prog $*: exit $rc, want $want; stderr: $(head -3 "$err")"
    fails=$((fails + 1))
  elif [[ $want == 0 ]]; then
    [[ $out == usage:* ]] || { echo "FAIL: $prog $*: no usage on stdout"; fails=$((fails + 1)); }
  elif [[ $(wc -l <"$err") != 1 ]] || ! grep -q -- "$pattern" "$err"; then
    echo "FAIL: $prog $*: want one line matching '$pattern', got: $(cat "$err")"
    fails=$((fails + 1))
  fi
  rm -f "$err"
}

programs=0
for prog in planner reshard_local model mpi_reshard mpi_collectives mpi_training cluster_suite \
  gpu_reshard_bench; do
  [[ -x $bin/$prog ]] || continue
  programs=$((programs + 1))
  expect "$prog" 0 "" --help
  expect "$prog" 2 "^$prog: --no-such-option: unknown option" --no-such-option
done
((programs >= 3)) || { echo "FAIL: only $programs bench programs in $bin"; exit 1; }

# Values: each kind of option, where its program was built.
if [[ -x $bin/mpi_reshard ]]; then
  expect mpi_reshard 2 "^mpi_reshard: --iters: want an integer in \[1, " --iters abc
  expect mpi_reshard 2 "^mpi_reshard: --iters: want an integer in \[1, " --iters 0
  expect mpi_reshard 2 "^mpi_reshard: --backend: want mpi|ucx, got 'tcp'" --backend tcp
  expect mpi_reshard 2 "^mpi_reshard: --json: needs a value (FILE)" --json
  expect mpi_reshard 2 "^mpi_reshard: --max-mib: want an integer" --max-mib 99999999999999999999
fi
if [[ -x $bin/mpi_collectives ]]; then
  expect mpi_collectives 2 "^mpi_collectives: --sparse-densities: want numbers in (0, 1\], got '2'" \
    --sparse-densities 0.1,2
  expect mpi_collectives 2 "^mpi_collectives: --sparse-densities: want numbers in (0, 1\], got ''" \
    --sparse-densities 0.1,
  expect mpi_collectives 2 "^mpi_collectives: --node-kib: want an integer" --node-kib -1
fi
if [[ -x $bin/mpi_training ]]; then
  expect mpi_training 2 "^mpi_training: --schedule: " --schedule sideways
  expect mpi_training 2 "^mpi_training: --heads: want an integer" --heads 2x
  # Its first step is a warm-up, left out: with one, nothing was measured (zeros as results).
  expect mpi_training 2 "^mpi_training: --steps: want an integer in \[2, " --steps 1
fi
if [[ -x $bin/cluster_suite ]]; then
  expect cluster_suite 2 "^cluster_suite: --sizes-mib: want an integer in \[1, 4096\], got '0'" \
    --sizes-mib 16,0
  expect cluster_suite 2 "^cluster_suite: --sizes-mib: want an integer in \[1, 4096\], got ''" \
    --sizes-mib 16,,64
fi
expect model 2 "^model: --json: needs a value" --json

echo "$checked checks on $programs programs, $fails failed"
((fails == 0))
