#!/usr/bin/env bash
# Installs a build of meshcast into a temporary prefix, then, for every component it installed
# (core, mpi, ucx, nccl, training), builds and runs tests/consumer/COMPONENT.cc against it twice:
# with CMake's find_package(meshcast COMPONENTS ...) and with `pkg-config meshcast[-COMPONENT]`.
# Each CMake build runs as on a machine without the other components' dependencies: the
# packages they would need (MPI, CUDAToolkit, ZLIB) are disabled unless it is its own. The
# core program must not load MPI, CUDA or BLAS; a component this build lacks must be refused
# by name; no installed CMake file may name an absolute path outside the prefix; and every
# installed header compiles on its own.
# Usage: run.sh BUILD_DIR CXX_COMPILER [CXX_FLAGS]   (ctest test package.consumer)
set -euo pipefail
build=$1
cxx=$2
cxxflags=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/meshcast-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
mpirun_flags=(--allow-run-as-root --oversubscribe --mca btl self,vader)
# MPI and UCX keep memory until exit: a sanitized consumer must not fail on their leaks.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
fail() { echo "consumer: FAIL: $*"; exit 1; }

echo "== install $build into $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || {
  cat "$work/install.log"; exit 1; }
config=$(dirname "$(find "$work/prefix" -name meshcastConfig.cmake -print -quit)")
pc_dir=$(dirname "$(find "$work/prefix" -name meshcast.pc -print -quit)")
# Relocatable: paths are the prefix's (${_IMPORT_PREFIX}) or found where the package is used.
if grep -n -E '"/(usr|opt|home|root|work|tmp)/' "$config"/*.cmake; then
  fail "an installed CMake file names an absolute path"
fi

# run_component NAME: runs the consumer built for NAME (in $1/consumer).
run_component() {
  local exe=$2/consumer port rc=0
  case $1 in
    core | training) "$exe" ;;
    mpi) mpirun "${mpirun_flags[@]}" -np 4 "$exe" ;;
    ucx)
      port=$(python3 "$here/../support/free_port.py")
      MESHCAST_RANK=1 MESHCAST_SIZE=2 MESHCAST_RENDEZVOUS=127.0.0.1:$port "$exe" &
      MESHCAST_RANK=0 MESHCAST_SIZE=2 MESHCAST_RENDEZVOUS=127.0.0.1:$port "$exe" || rc=$?
      wait $! || rc=$?
      return $rc ;;
    nccl)
      port=$(python3 "$here/../support/free_port.py")
      MESHCAST_RANK=0 MESHCAST_SIZE=1 MESHCAST_RENDEZVOUS=127.0.0.1:$port "$exe" || rc=$?
      [[ $rc -eq 77 ]] && return 0  # linked and started; no GPU to run on
      return $rc ;;
  esac
}

# Every installed header compiles alone from the prefix: it includes only installed headers.
for header in $(cd "$work/prefix/include" && find meshcast -name '*.h' | sort); do
  echo "#include <$header>" | "$cxx" -std=c++20 $cxxflags -fsyntax-only -I "$work/prefix/include" \
    -x c++ - || fail "$header does not compile alone from the installed headers"
done

components=(core)
for c in mpi ucx nccl training; do
  [[ -f $config/meshcast-$c-targets.cmake ]] && components+=("$c")
done
echo "== components installed: ${components[*]}"
for c in "${components[@]}"; do
  # What a machine with only this component's dependencies lacks.
  disabled=()
  for p in MPI CUDAToolkit ZLIB; do
    case $c:$p in mpi:MPI | nccl:CUDAToolkit | training:ZLIB) ;;
      *) disabled+=("-DCMAKE_DISABLE_FIND_PACKAGE_$p=TRUE") ;; esac
  done
  echo "== find_package(meshcast COMPONENTS $c) without: ${disabled[*]#-DCMAKE_DISABLE_FIND_PACKAGE_}"
  cmake -S "$here" -B "$work/cmake-$c" -DCMAKE_BUILD_TYPE=Release -DCOMPONENT="$c" \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$cxxflags" \
    -DCMAKE_PREFIX_PATH="$work/prefix" "${disabled[@]}" >"$work/configure-$c.log" || {
    cat "$work/configure-$c.log"; fail "configure $c"; }
  cmake --build "$work/cmake-$c" >"$work/build-$c.log" || { cat "$work/build-$c.log"; fail "build $c"; }
  run_component "$c" "$work/cmake-$c" || fail "run $c (CMake)"

  pc=meshcast-$c
  [[ $c == core ]] && pc=meshcast
  echo "== pkg-config $pc"
  mkdir -p "$work/pc-$c"
  # shellcheck disable=SC2046,SC2086  # flags are meant to split into words
  PKG_CONFIG_PATH="$pc_dir" "$cxx" -std=c++20 $cxxflags "$here/$c.cc" -o "$work/pc-$c/consumer" \
    $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs "$pc") || fail "pkg-config build $c"
  run_component "$c" "$work/pc-$c" || fail "run $c (pkg-config)"
done

# The core program loads nothing of the others.
if ldd "$work/cmake-core/consumer" | grep -E 'libmpi|libcuda|libnccl|libopenblas|libucp'; then
  fail "the core consumer loads another component's library"
fi
# A component this build lacks is refused, naming it.
if cmake -S "$here" -B "$work/cmake-bogus" -DCOMPONENT=bogus -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure-bogus.log" 2>&1; then
  fail "find_package(meshcast COMPONENTS bogus) succeeded"
fi
grep -q "built without its bogus component" "$work/configure-bogus.log" ||
  { cat "$work/configure-bogus.log"; fail "the refusal does not name the component"; }
echo "consumer: ${components[*]} built and ran with find_package and pkg-config"
