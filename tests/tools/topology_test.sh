#!/usr/bin/env bash
# --topology by preset name and `auto` without a job; the presets of an installed tree that was
# moved (found relative to the program, not the source tree); MESHCAST_TOPOLOGY_PATH first.
# Usage: tests/tools/topology_test.sh path/to/meshcast   (MESHCAST_BUILD_DIR: the build to install)
# shellcheck disable=SC2054,SC2012  # commas in shapes; plain file names
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
MC=${1:?usage: topology_test.sh path/to/meshcast}
MC=$(cd "$(dirname "$MC")" && pwd)/$(basename "$MC")
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
unset MESHCAST_TOPOLOGY_PATH
cd "$TMP" || exit 2  # not the repository root: presets are not found relative to the cwd

pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

P=(plan --shape 64,64 --dtype f32 --src 2x2@0-3:S0R --dst "2x2@[3,2,1,0]:RS0" --json)
topology_of() {  # PROGRAM ARGS...: the topology name `plan --json` reports, or "rc=N: stderr"
  local prog=$1 out rc
  shift
  out=$(timeout 60 "$prog" "${P[@]}" "$@" 2>"$TMP/err")
  rc=$?
  if [[ $rc -ne 0 ]]; then echo "rc=$rc: $(head -c 300 "$TMP/err")"; return; fi
  python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["topology"])' <<<"$out"
}
expect() {  # WANT WHAT PROGRAM ARGS...
  local want=$1 what=$2 got
  shift 2
  got=$(topology_of "$@")
  if [[ $got == "$want" ]]; then ok; else bad "$what: got '$got', want '$want'"; fi
}
# refused WHAT PATTERN PROGRAM ARGS...: exit 2, one line on stderr matching PATTERN.
refused() {
  local what=$1 pattern=$2 prog=$3 err rc
  shift 3
  err=$(timeout 60 "$prog" "${P[@]}" "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq 2 && $(wc -l <<<"$err") -eq 1 && $err =~ $pattern ]]; then ok; else
    bad "$what: rc=$rc: ${err:0:300}"; fi
}

# From the build tree: the source tree's presets, by name with or without .json.
expect dgx-a100 "build tree, dgx-a100" "$MC" --topology dgx-a100
expect aws-p3.8xlarge "build tree, aws-p3.8xlarge.json" "$MC" --topology aws-p3.8xlarge.json
expect dgx-a100 "a file path" "$MC" --topology "$ROOT/meshes/dgx-a100.json"
refused "unknown preset" \
  "^meshcast: topology: unknown topology 'dgx-a1000': not a file, and no preset of that name \(presets: aws-p3.8xlarge, cluster-1024x8, dgx-a100, " \
  "$MC" --topology dgx-a1000
# auto without a job: one host; auto:PRESET checks the preset.
expect single-host "plan --topology auto" "$MC" --topology auto
expect single-host "plan --topology auto:dgx-a100" "$MC" --topology auto:dgx-a100
refused "auto:nope" "^meshcast: topology: unknown topology 'nope'" "$MC" --topology auto:nope
out=$(timeout 60 "$MC" reshard --shape 64,64 --dtype f32 --src 2x2@0-3:S0R --dst "2x2@[3,2,1,0]:RS0" \
      --topology auto --verify --json 2>&1)
if [[ $out == *'"verified":true'* && $out == *'"topology":"single-host"'* ]]; then ok; else
  bad "reshard --backend local --topology auto: ${out:0:300}"; fi
# MESHCAST_TOPOLOGY_PATH comes first.
mkdir -p "$TMP/mine"
sed 's/"name": "perlmutter"/"name": "my-dgx"/' "$ROOT/meshes/perlmutter.json" >"$TMP/mine/dgx-a100.json"
MESHCAST_TOPOLOGY_PATH="/nonexistent:$TMP/mine" expect my-dgx "MESHCAST_TOPOLOGY_PATH" "$MC" --topology dgx-a100

# An installed tree, moved: its presets are found relative to its program.
if [[ -n ${MESHCAST_BUILD_DIR:-} ]]; then
  if cmake --install "$MESHCAST_BUILD_DIR" --prefix "$TMP/a" >"$TMP/install.log" 2>&1; then
    mv "$TMP/a" "$TMP/b"
    share=$(find "$TMP/b" -type d -path "*/meshcast/meshes" -print -quit)
    installed=$(cd "$share" 2>/dev/null && ls ./*.json | sort | tr '\n' ' ')
    shipped=$(cd "$ROOT/meshes" && ls ./*.json | sort | tr '\n' ' ')
    if [[ -n $share && $installed == "$shipped" ]]; then ok; else
      bad "installed presets in '$share': $installed (shipped: $shipped)"; fi
    IMC=$TMP/b/bin/meshcast
    # The build's library directories (RUNPATH is not installed): MPI, UCX, CUDA.
    libs=$(readelf -d "$MC" 2>/dev/null | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
    export LD_LIBRARY_PATH=${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    expect dgx-a100 "installed and moved" "$IMC" --topology dgx-a100
    # Not the source tree's: without the installed copy the name is unknown.
    rm "$share/dgx-a100.json"
    refused "installed, preset removed" "unknown topology 'dgx-a100'" "$IMC" --topology dgx-a100
    expect gb200-nvl72 "installed, another preset" "$IMC" --topology gb200-nvl72
  else
    bad "cmake --install $MESHCAST_BUILD_DIR failed: $(tail -n 3 "$TMP/install.log")"
  fi
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
