#!/usr/bin/env bash
# docs/sync.md is what bench/sync_report.py writes from docs/data/sync-*.json and
# bench/sync_commentary.md: regenerated in a scratch directory, it must equal the committed one
# (a commentary or a figure edited by hand, or data left behind, shows here).
#   bench/sync_report_test.sh   (from the repository root)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Plots are left out: they need matplotlib, and the text does not depend on them.
python3 "$root/bench/sync_report.py" "$root"/docs/data/sync-*.json --doc "$tmp/docs/sync.md" \
  --img "$tmp/docs/img" --no-plots
if ! diff -u "$root/docs/sync.md" "$tmp/docs/sync.md" >"$tmp/diff"; then
  echo "FAIL: docs/sync.md differs from what bench/sync_report.py writes from docs/data:"
  head -40 "$tmp/diff"
  exit 1
fi
echo "docs/sync.md matches its data ($(ls "$root"/docs/data/sync-*.json | wc -l) runs)"
