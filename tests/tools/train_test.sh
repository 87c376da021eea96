#!/usr/bin/env bash
# `meshcast train gpt|utransformer`: parallel runs give the serial run's losses, the loss falls
# (below the corpus's unigram entropy for text), --config fills options, checkpoints resume on
# another mesh with the uninterrupted run's losses and a corrupt one is refused, --plan orders
# configurations, and bad configurations exit 2 with one line naming the field. The checkpoint
# directory's faults and the limits: checkpoint_faults_test.sh.
# Usage: train_test.sh MESHCAST
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mc=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../support/train_helpers.sh"

for kind in gpt utransformer; do
  common=(--steps 4 --batch 8 --seq 16 --d-model 32 --layers 4 --heads 4 --json --out "$tmp/out")
  serial=$("$mc" train $kind "${common[@]}" | losses)
  for stages in "dp=2" "tp=2/tp=2" "dp=2,tp=2/grid=2x1x1" "grid=1x2x2/dp=1/dp=2"; do
    for schedule in 1f1b eager-1f1b; do
      got=$("$mc" train $kind "${common[@]}" --stages "$stages" --micro-batches 2 --schedule "$schedule" | losses)
      close "$serial" "$got" && ok || bad "$kind $stages $schedule: losses [$got], serial [$serial]"
    done
  done
  # Planned on a topology, a pipeline's stage-boundary reshards train the same (its Run's
  # pointer to the topology once dangled: "internal error: out of memory", exit 1).
  got=$("$mc" train $kind "${common[@]}" --stages dp=1/dp=2 --topology dgx-a100 | losses)
  close "$serial" "$got" && ok || bad "$kind on dgx-a100: losses [$got], serial [$serial]"
done

# GPT on the Debian corpus: the held-out loss falls well below the unigram entropy (a small
# model, so that the sanitizer builds run it in seconds).
out=$("$mc" train gpt --steps 300 --d-model 32 --layers 2 --seq 32 --lr 0.01 --json --out "$tmp/out")
if printf '%s\n' "$out" | python3 -c 'import json,sys
j = json.loads(sys.stdin.readline())
last = j["steps"][-1]
sys.exit(0 if last["eval_loss"] < 0.85 * j["unigram_entropy"] else 1)'; then ok; else
  bad "gpt did not beat the unigram entropy: $(printf '%s' "$out" | head -c 300)"; fi
for f in gpt-loss.png gpt-steps.png gpt-run.json; do
  [[ -s $tmp/out/$f ]] && ok || bad "missing $f"
done
head -c 8 "$tmp/out/gpt-loss.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" && ok || bad "not a PNG"

# The U-Transformer's denoising loss falls.
curve=$("$mc" train utransformer --steps 60 --seq 32 --json --out "$tmp/out" | losses)
python3 -c "import sys; v=[float(x) for x in '$curve'.split()]; sys.exit(0 if v[-1] < 0.7 * v[0] else 1)" &&
  ok || bad "utransformer loss did not fall: $curve"

# Plain progress lines when not on a terminal, and the summary.
lines=$("$mc" train gpt --steps 4 --eval-every 2 --stages dp=1/dp=1 --micro-batches 2 --out "$tmp/out" | grep -c 'held-out')
[[ $lines -ge 3 ]] && ok || bad "expected progress lines with held-out losses, got $lines"

# --config fills what the command line does not give; the command line wins.
printf '{"stages": "dp=2", "micro_batches": 2, "steps": 3, "d_model": 32, "seq": 16, "batch": 8, "overlap": false}' > "$tmp/c.json"
got=$("$mc" train gpt --config "$tmp/c.json" --steps 2 --json --out "$tmp/out" | python3 -c 'import json,sys
j = json.loads(sys.stdin.readline()); print(len(j["steps"]), j["stages"], j["overlap"])')
[[ $got == "2 dp=2,tp=1 False" ]] && ok || bad "--config: $got"
# A run repeats from its own run.json's config (which writes the options not given as "").
python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))["config"], open(sys.argv[2], "w"))' \
  "$tmp/out/gpt-run.json" "$tmp/again.json"
first=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$tmp/out/gpt-run.json" | losses)
again=$("$mc" train gpt --config "$tmp/again.json" --json 2>/dev/null | losses)
[[ -n $again && $again == "$first" ]] && ok || bad "repeated from run.json: [$again], first [$first]"

# Checkpoints: 6 steps uninterrupted vs 3 steps on one mesh, then resumed on another to 6. The
# resumed run's JSON (and charts) hold the whole run: the first 3 steps from the earlier JSON.
ck=(--batch 8 --seq 16 --d-model 32 --layers 4 --heads 4 --json --out "$tmp/out")
full=$("$mc" train gpt "${ck[@]}" --steps 6 | losses)
"$mc" train gpt "${ck[@]}" --steps 3 --stages dp=2,tp=2 --checkpoint-dir "$tmp/ck" >/dev/null
"$mc" train gpt "${ck[@]}" --steps 6 --stages grid=1x2x1/dp=2 --micro-batches 2 --checkpoint-dir "$tmp/ck" --resume >"$tmp/resumed.json"
rest=$(losses <"$tmp/resumed.json")
close "$full" "$rest" && ok || bad "resume on another mesh: [$rest] vs [$full]"
got=$(python3 -c 'import json,sys
j = json.load(open(sys.argv[1])); print(j["steps_run"], j["resumed_from"], [s["step"] for s in j["steps"]] == list(range(1, 7)))' "$tmp/resumed.json")
[[ $got == "3 3 True" ]] && ok || bad "resumed run JSON: steps_run, resumed_from, whole history: $got"
[[ -f $tmp/ck/latest && -d $tmp/ck/$(cat "$tmp/ck/latest") ]] && ok || bad "no latest checkpoint"
# A corrupt newest checkpoint (steps 3 and 6 are kept) gives way to the older one, with a warning
# naming the file; it is moved aside, so the run saves its step again.
latest=$tmp/ck/$(cat "$tmp/ck/latest")
victim=$(ls "$latest"/device-*.bin | head -1)
printf 'X' | dd of="$victim" bs=1 seek=17 conv=notrunc 2>/dev/null
"$mc" train gpt "${ck[@]}" --steps 6 --checkpoint-dir "$tmp/ck" --resume >"$tmp/fellback.json" 2>"$tmp/err"
rc=$?
err=$(cat "$tmp/err")
[[ $rc -eq 0 && $err == *"$latest is corrupt ("*"$(basename "$victim"): checksum mismatch); moved to $latest.corrupt"* &&
   -d $latest.corrupt && -d $latest ]] && ok || bad "corrupt newest checkpoint: rc=$rc $err"
close "$full" "$(losses <"$tmp/fellback.json")" && ok || bad "resumed from the older checkpoint: losses differ"
# Every checkpoint corrupt: refused (exit 2, naming the newest's file) and left as it was.
for d in "$tmp"/ck/step-????????; do
  printf 'X' | dd of="$(ls "$d"/device-*.bin | head -1)" bs=1 seek=17 conv=notrunc 2>/dev/null
done
before=$(cd "$tmp/ck" && find . -type f ! -name .lock -exec md5sum {} + | sort | md5sum)
err=$("$mc" train gpt "${ck[@]}" --steps 8 --checkpoint-dir "$tmp/ck" --resume 2>&1 >/dev/null)
rc=$?
after=$(cd "$tmp/ck" && find . -type f ! -name .lock -exec md5sum {} + | sort | md5sum)
[[ $rc -eq 2 && $err == *"$latest/device-"* && $before == "$after" ]] &&
  ok || bad "every checkpoint corrupt: rc=$rc $err"

# Killing the trainer while it saves (every step) loses no earlier checkpoint: the newest
# complete one resumes.
for delay in 0.7 1.3 2.1; do
  rm -rf "$tmp/kill"
  "$mc" train gpt "${ck[@]}" --steps 400 --checkpoint-dir "$tmp/kill" --checkpoint-every 1 \
    >/dev/null 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [[ -f $tmp/kill/latest ]]; then
    # --steps 1: load (checksums and all) and stop, saying where the checkpoint is (--json:
    # still one JSON document).
    out=$("$mc" train gpt "${ck[@]}" --steps 1 --checkpoint-dir "$tmp/kill" --resume -q)
    [[ $? -eq 0 && $(python3 -c 'import json,sys; j = json.loads(sys.stdin.read())
print(j["steps_run"], j["resumed_from"] >= 1)' <<<"$out") == "0 True" ]] && ok ||
      bad "killed after ${delay}s: resume failed: $out"
    text=()
    for x in "${ck[@]}"; do [[ $x == --json ]] || text+=("$x"); done
    out=$("$mc" train gpt "${text[@]}" --steps 1 --checkpoint-dir "$tmp/kill" --resume 2>&1)
    [[ $? -eq 0 && $out =~ "checkpoint is at step "[1-9] ]] && ok ||
      bad "killed after ${delay}s: resume failed: $out"
  else
    ok  # killed before the first checkpoint completed: nothing to lose
  fi
done

# --plan: the configurations by estimated step time, best first.
out=$("$mc" train gpt --plan --devices 8 --top 3 --topology meshes/emulated.json --json)
if printf '%s\n' "$out" | python3 -c 'import json,sys
c = json.loads(sys.stdin.readline())["configurations"]
s = [x["seconds"] for x in c]
sys.exit(0 if len(c) == 3 and s == sorted(s) else 1)'; then ok; else bad "--plan: $out"; fi

# Bad input: exit 2, one line, naming the field (a file that cannot be read: exit 4).
expect_error() {
  local field=$1
  shift
  expect_exit 2 "$field" "$mc" train "$@" --out "$tmp/out"
}
expect_error "stages[0].cols" gpt --stages tp=3
expect_error "stages[1].grid" gpt --stages dp=1/grid=2x2
expect_exit 2 "out: given empty; leave it out for the default" "$mc" train gpt --out ""
# Every 10th KiB is held out: 9,216 bytes hold none of it; the error says what would.
head -c 9216 /usr/share/common-licenses/GPL-3 >"$tmp/short.txt"
expect_exit 2 "it needs at least 9222 bytes" "$mc" train gpt --data "$tmp/short.txt" --seq 4 --out "$tmp/out"
expect_error "stages[0].tp: given twice" gpt --stages tp=2,tp=4
expect_error "stages[0].dp: expected a positive integer, got ' 1'" gpt --stages "dp= 1"
expect_error "stages[0].dp: expected a positive integer, got '+2'" gpt --stages "dp=+2"
expect_error "stages[0]: expected key=value items (dp=, tp=, grid=RxCxD), got ''" gpt --stages "dp=2,"
expect_error "stages[1].grid: expected a positive integer, got ''" gpt --stages "dp=1/grid=2x1x1x"
expect_error "batch: expected an integer in 1..1048576, got '+4'" gpt --batch +4
expect_error "lr: expected a number in [0, 10], got 'nan'" gpt --lr nan
expect_error "lr: expected a number in [0, 10], got ' 0.5'" gpt --lr " 0.5"
# A value given empty is refused, not taken as "none" (no checkpoints, the default topology).
expect_error "checkpoint-dir: given empty; leave it out for the default" gpt --checkpoint-dir ""
expect_error "topology: given empty; leave it out for the default" gpt --topology ""
expect_error "config: given empty; leave it out for the default" gpt --config ""
# 1047553 x 4100 devices wrapped to 4 in 32 bits.
expect_error "stages[0]: needs 4294967300 devices" gpt --stages dp=1047553,grid=4100x1x1
expect_error "schedule" gpt --schedule sideways
expect_error "batch" gpt --micro-batches 3
expect_error "layers" gpt --stages dp=1/dp=1/dp=1/dp=1/dp=1
expect_error "micro_batches" gpt --stages dp=1/dp=1 --schedule interleaved --chunks 2 --micro-batches 1
# Every micro-batch's receive is posted at a step's start: 1,024 of 65 tags each (32 devices a
# stage) would pass a group's 65,536-tag window, and the reservations would wait on each other.
expect_error "micro_batches: 1024 micro-batches of a stage transfer of 65 tags need 66560 tags" \
  gpt --data random --seq 1 --d-model 4 --heads 1 --layers 2 --stages dp=32/dp=32 \
  --micro-batches 1024 --batch 32768
expect_error "backend" gpt --backend carrier-pigeon
expect_exit 4 "data: cannot read '/nonexistent': No such file" "$mc" train gpt --data /nonexistent
expect_error "devices" gpt --plan --devices 0
# Flags the other path would drop are refused, not ignored.
expect_error "devices: only with --plan" gpt --devices 4
expect_error "checkpoint-dir: --plan trains nothing" gpt --plan --checkpoint-dir "$tmp/ck"
expect_error "micro-batches: --plan trains nothing" utransformer --plan --micro-batches 2
expect_error "lr" gpt --lr fast
expect_error "layers" utransformer --layers 3
expect_error "seq" utransformer --layers 6 --seq 6
expect_error "noise" utransformer --noise 2
expect_error "resume" gpt --resume
expect_error "checkpoint-every: needs --checkpoint-dir" gpt --checkpoint-every 2
expect_exit 4 "config: cannot read '/nonexistent.json'" "$mc" train gpt --config /nonexistent.json
printf '{"stagez": 1}' > "$tmp/bad.json"
expect_error "config.stagez" gpt --config "$tmp/bad.json"

echo "train_test: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
