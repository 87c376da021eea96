#!/usr/bin/env bash
# README's commands, run as written, so that they cannot drift from the code: every ```sh block
# runs as one bash script in a scratch directory that looks like the repository after a build
# (build/default/bin/meshcast is the CLI under test, build/default/python the package, models/,
# meshes/ and examples/ the tree's); a block followed by an output block must print it: each
# line of the output block (but "...") appears in what it printed, decimal numbers masked (times
# vary), and a JSON line has the same keys and the same strings, booleans and integers.
# Blocks that build, install or need root's network namespaces (scripts/, cmake, bench/) are the
# CI's own steps or bench/cluster's, and are skipped, each with its reason.
# Usage: readme_test.sh path/to/meshcast          (MESHCAST_BUILD_DIR: the build, for python/)
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${MESHCAST_BUILD_DIR:-$(dirname "$(dirname "$mc")")}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build/default/bin"
ln -s "$mc" "$tmp/build/default/bin/meshcast"
[[ -d $build/python ]] && ln -s "$build/python" "$tmp/build/default/python"
for d in models meshes examples; do ln -s "$root/$d" "$tmp/$d"; done
python3 - "$root/README.md" "$tmp" <<'PY'
import json, re, subprocess, sys

readme, work = sys.argv[1], sys.argv[2]
text = open(readme).read()
# (language, body, line, start, end) of every fenced block.
blocks = [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, m.start(), m.end())
          for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M)]
SKIP = {"scripts/": "builds and runs the suites: CI's own command",
        "cmake": "builds: CI's own command",
        "bench/": "needs network namespaces and minutes: bench/cluster/cluster.sh check"}
masked = lambda s: re.sub(r"\d+\.\d+(e[-+]?\d+)?", "#", s)
passed = failed = 0

def stable(j):  # what a JSON output must repeat: keys, strings, booleans, integers
    if isinstance(j, dict):
        return {k: stable(v) for k, v in j.items()}
    return j if isinstance(j, (str, bool)) or (isinstance(j, int) and j is not True) else None

for i, (lang, body, line, _, end) in enumerate(blocks):
    if lang != "sh":
        continue
    why = next((r for k, r in SKIP.items() if k in body), None)
    if why:
        print(f"skip README.md:{line}: {why}")
        continue
    # Its output: a plain block right after it, nothing but blank lines between.
    expected = blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "" and \
        not text[end:blocks[i + 1][3]].strip() else None
    try:
        p = subprocess.run(["bash", "-eo", "pipefail", "-c", body], cwd=work, timeout=600,
                           capture_output=True, text=True)
        out, rc = p.stdout, p.returncode
        err = p.stderr
    except subprocess.TimeoutExpired:
        out, rc, err = "", 124, "timed out after 600 s"
    problems = [] if rc == 0 else [f"exit status {rc}: {err.strip()[-600:]}"]
    if expected is not None and rc == 0:
        lines = [masked(l) for l in out.splitlines()]
        for want in expected.splitlines():
            if want.strip() in ("", "..."):
                continue
            if want.startswith("{"):
                w = json.loads(want.replace("[...]", "[]"))
                got = next((json.loads(l) for l in out.splitlines() if l.startswith("{")), None)
                if got is None or set(got) != set(w) or any(
                        stable(w[k]) is not None and stable(got[k]) != stable(w[k]) for k in w):
                    problems.append(f"JSON differs: README {want[:200]} / printed "
                                    f"{json.dumps(got)[:300]}")
            elif masked(want) not in lines:
                problems.append(f"README shows {want!r}; it printed none such")
    if problems:
        failed += 1
        print(f"FAIL README.md:{line}:\n  " + "\n  ".join(problems))
    else:
        passed += 1
        print(f"ok   README.md:{line}")
print(f"readme_test: {passed} passed, {failed} failed")
sys.exit(1 if failed or not passed else 0)
PY
