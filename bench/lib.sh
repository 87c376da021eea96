# Sourced by bench/run-*.sh (and bench/reports_test.sh), before anything else they do:
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# It moves to the repository root ($root) and gives the scripts what they share:
# - bench_build DIR TARGET...: a Release build of the bench programs TARGET in $BUILD_DIR
#   (default DIR), tests and tools off; sets $build;
# - mpirun_shm ARGS...: an MPI job with every rank on this host, in shared memory;
# - needs_hosts WHO: exit 77 (skipped) with a line on stderr where hosts cannot be emulated;
# - $python: an interpreter that has matplotlib ($PYTHON if given; a pyenv python3 earlier on
#   PATH may lack Debian's python3-matplotlib), for the reports.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

bench_build() {
  build=${BUILD_DIR:-$1}
  shift
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DMESHCAST_BUILD_TOOLS=OFF \
    -DMESHCAST_BUILD_BENCH=ON >/dev/null
  cmake --build "$build" -j"${JOBS:-2}" --target "$@"
}

# Open MPI's vader transport without a single-copy mechanism (containers refuse it), idle ranks
# yielding their core (4-8 ranks oversubscribe 2 cores), and no binding (Open MPI pins jobs of
# at most 2 ranks to cores).
mpirun_shm() {
  mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 "$@"
}

needs_hosts() {
  bench/cluster/cluster.sh check >/dev/null 2>&1 ||
    { echo "$1: needs emulated hosts (root, network namespaces)" >&2; exit 77; }
}

python=${PYTHON:-}
if [[ -z $python ]]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then python=$p; break; fi
  done
  python=${python:-python3}
fi
