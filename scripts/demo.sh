#!/usr/bin/env bash
# The quick start: installs what is missing, builds the default (Release) preset and runs
# `meshcast demo` on the in-process backend (no launcher, no GPU needed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
cmake --preset default
cmake --build --preset default -j 2
exec build/default/bin/meshcast demo "$@"
