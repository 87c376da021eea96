#!/usr/bin/env bash
# Installs the Debian packages meshcast needs to build, test and benchmark. Idempotent: checks
# each package with dpkg-query and installs only the missing ones (apt-get update only then).
# Needs root only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake clang libclang-rt-14-dev pkg-config python3 python3-matplotlib
  googletest libgtest-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
  openmpi-bin libopenmpi-dev libucx-dev ucx-utils libscalapack-openmpi-dev libopenblas-dev
  zlib1g-dev python3-pil
  iproute2 util-linux
  python3-dev pybind11-dev python3-numpy python3-pytest python3-mpi4py python3-torch
  python3-venv python3-pip python3-setuptools python3-wheel
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: missing: ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "setup: not root; install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
echo "setup: installed ${missing[*]}"
