#!/usr/bin/env bash
# Installs a build of meshcast into a temporary prefix, then builds and runs tests/consumer
# against it twice: with CMake's find_package(meshcast) and with `pkg-config meshcast`.
# Usage: run.sh BUILD_DIR CXX_COMPILER [CXX_FLAGS]   (ctest test package.consumer)
set -euo pipefail
build=$1
cxx=$2
cxxflags=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/meshcast-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== install $build into $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || {
  cat "$work/install.log"; exit 1; }

echo "== find_package(meshcast)"
cmake -S "$here" -B "$work/cmake" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$cxxflags" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" || {
  cat "$work/configure.log"; exit 1; }
cmake --build "$work/cmake"
"$work/cmake/consumer"

echo "== pkg-config meshcast"
pc_dir=$(dirname "$(find "$work/prefix" -name meshcast.pc -print -quit)")
export PKG_CONFIG_PATH="$pc_dir"
# shellcheck disable=SC2046,SC2086  # flags are meant to split into words
"$cxx" -std=c++20 $cxxflags "$here/main.cc" -o "$work/consumer-pc" \
  $(pkg-config --cflags --libs meshcast)
"$work/consumer-pc"
echo "consumer: both builds ran"
