#!/usr/bin/env bash
# `meshcast train` against a damaged or foreign checkpoint directory, bad paths and its limits:
# an edited manifest gives way to the older checkpoint (with a warning; refused, exit 2, when every
# one is edited), another model or configuration, or checkpoints without --resume are refused
# (exit 2) before any work and change nothing; a missing or stale DIR/latest resumes from the
# newest checkpoint with a line on stderr saying why; outputs that cannot be written are refused
# (exit 4) before training; a directory as --config, a device or FIFO as --data, a corpus over
# its limit, malformed --stages and a model over the memory limit exit 2 at once (the last with
# little memory used); so do a resume whose load is over it and a manifest over the file limit.
# A checkpoint whose state no training leaves (NaN, a negative second moment) is corrupt.
# Usage: checkpoint_faults_test.sh MESHCAST
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
mc=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../support/train_helpers.sh"

small=(--batch 8 --seq 16 --d-model 32 --layers 2 --heads 4 --json --out "$tmp/out")
ck=$tmp/ck
# Every file under a directory and its contents, to show that a refused run changed nothing
# (but DIR/.lock, which names the run that last held it).
digest() { (cd "$1" && find . -type f ! -name .lock -exec md5sum {} + | sort | md5sum); }
# A fresh $ck holding the checkpoints of steps 2 and 4 of a small GPT.
fresh() {
  rm -rf "$ck"
  "$mc" train gpt "${small[@]}" --steps 4 --checkpoint-every 2 --checkpoint-dir "$ck" >/dev/null
}
resume() { "$mc" train "$@" "${small[@]}" --checkpoint-dir "$ck" --resume; }
unchanged() {
  [[ $(digest "$ck") == "$before" ]] && ok || bad "$1: the refused run changed $ck"
}
# reseal STEP_DIR CODE: runs the Python CODE on the step's manifest as `j` (with `step`, the
# directory, and `fnv`, FNV-1a 64 as hex), then writes it back with its checksum recomputed, as
# any tool can: only the checks after the checksum's can refuse it.
reseal() {
  python3 - "$1" "$2" <<'PY'
import json, os, struct, sys
def fnv(data):
    h = 0xcbf29ce484222325
    for c in data:
        h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h
step, code = sys.argv[1], sys.argv[2]
manifest = os.path.join(step, "manifest.json")
j = json.load(open(manifest))
exec(code)
j.pop("checksum")
j["checksum"] = fnv(json.dumps(j, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode())
open(manifest, "w").write(json.dumps(j, indent=2))
PY
}

# An edited manifest: one character of it (an offset 4 bytes on: the values would be read
# shifted) is refused by the manifest's checksum.
fresh
python3 - "$ck/step-00000004/manifest.json" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
start = text.index('"offsets"')
for m in re.finditer(r': (\d+)', text[start:]):
    if int(m.group(1)) > 0 and m.group(1)[-1] in "012345":
        at = start + m.start(1)
        text = text[:at] + str(int(m.group(1)) + 4) + text[at + len(m.group(1)):]
        break
else:
    sys.exit("no offset to edit")
open(path, "w").write(text)
PY
# The run passes over it to step 2 with a warning (moving it aside, so that it saves step 4
# again) and trains on from there as the uninterrupted run did.
full=$("$mc" train gpt "${small[@]}" --steps 6 | losses)
resume gpt --steps 6 >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
err=$(cat "$tmp/stderr")
[[ $rc -eq 0 && $err == *"step-00000004/manifest.json: checksum mismatch"*"passing over that checkpoint"* &&
   $err == *"$ck/step-00000004 is corrupt ("*"); moved to $ck/step-00000004.corrupt"* ]] &&
  ok || bad "edited manifest: rc=$rc, stderr: $err"
[[ -d $ck/step-00000004.corrupt && -d $ck/step-00000006 ]] && ok ||
  bad "edited manifest: after the run: $(ls "$ck")"
# (Its --out holds the uninterrupted run's JSON, which saved no checkpoint into $ck: not this
# run's history, so its steps start after the checkpoint.)
close "$(cut -d' ' -f3- <<<"$full")" "$(losses <"$tmp/stdout")" && ok ||
  bad "edited manifest: resumed losses differ"
# A newest checkpoint without its manifest (a save cut short by a lost disk) is passed over too.
fresh
rm "$ck/step-00000004/manifest.json"
resume gpt --steps 6 >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
err=$(cat "$tmp/stderr")
# (Its --out holds the history of the run that saved the checkpoints: all six steps.)
[[ $rc -eq 0 && $err == *"step-00000004/manifest.json"*"passing over that checkpoint"* ]] &&
  close "$full" "$(losses <"$tmp/stdout")" && ok ||
  bad "missing manifest: rc=$rc, stderr: $err"
# When every checkpoint is corrupt, the run is refused naming the newest, and changes nothing.
fresh
for step in 2 4; do
  printf '{' >>"$ck/step-0000000$step/manifest.json"
done
before=$(digest "$ck")
expect_exit 2 "step-00000004/manifest.json" resume gpt --steps 6
unchanged "every manifest edited"

# Another model of the same parameter shapes, another configuration, or no --resume: refused.
fresh
before=$(digest "$ck")
expect_exit 2 "checkpoint.model: $ck/step-00000004 was saved with model 'gpt', this run has 'utransformer'" \
  resume utransformer --steps 6
expect_exit 2 "checkpoint.config.vocab: $ck/step-00000004 was saved with vocab '256', this run has '300'" \
  resume gpt --steps 6 --vocab 300
expect_exit 2 "checkpoint-dir: $ck holds a checkpoint of step 4: continue it with --resume" \
  "$mc" train gpt "${small[@]}" --steps 6 --checkpoint-dir "$ck"
unchanged "foreign run"
# The same when the newest's files are corrupt and the checkpoint it gives way to is another
# model's: utransformer's step 2 behind gpt's step 4 (the check of the newest before the run
# passed). Refused, and nothing moved aside.
"$mc" train utransformer "${small[@]}" --steps 2 --checkpoint-dir "$tmp/u" >/dev/null
rm -r "$ck/step-00000002" && cp -a "$tmp/u/step-00000002" "$ck/"
printf 'X' | dd of="$ck/step-00000004/device-0.bin" bs=1 seek=17 conv=notrunc 2>/dev/null
before=$(digest "$ck")
expect_exit 2 "checkpoint.model: $ck/step-00000002 was saved with model 'utransformer', this run has 'gpt'" \
  resume gpt --steps 6
unchanged "a corrupt newest before another model's"

# A state no training leaves (its checksum and the manifest's resealed, as any tool can): every
# weight of device-0.bin NaN, or one second moment v negative (it made NaN weights at the next
# update, which were saved, and the run then said "nothing saved"). Each is corrupt: the run
# passes over it to step 2, names what is wrong, and trains on as the uninterrupted run did.
for forged in nan negative-v; do
  fresh
  reseal "$ck/step-00000004" '
path = os.path.join(step, "device-0.bin")
data = bytearray(open(path, "rb").read())
if "'"$forged"'" == "nan":
    data = bytearray(struct.pack("<f", float("nan")) * (len(data) // 4))
else:  # the first element of the v of the file'"'"'s first tile (value, m and v of V floats each)
    entry = [f for f in j["files"] if f["name"] == "device-0.bin"][0]
    offsets = sorted(entry["offsets"].values())
    volume = (offsets[1] if len(offsets) > 1 else len(data)) // 12
    data[8 * volume:8 * volume + 4] = struct.pack("<f", -1.0)
open(path, "wb").write(data)
for f in j["files"]:
    if f["name"] == "device-0.bin":
        f["fnv1a64"] = fnv(bytes(data))
'
  want=$([[ $forged == nan ]] && echo ": value element 0 is nan" || echo ": v element 0 is -1.000000")
  resume gpt --steps 6 >"$tmp/stdout" 2>"$tmp/stderr"
  rc=$?
  err=$(cat "$tmp/stderr")
  [[ $rc -eq 0 && $err == *"$ck/step-00000004 is corrupt ("*"device-0.bin: parameter "*"$want"* ]] &&
    ok || bad "$forged: rc=$rc, stderr: $err"
  # (--out holds a run that saved into $ck: its history, steps 1-2, comes first)
  close "$full" "$(losses <"$tmp/stdout")" && ok || bad "$forged: resumed losses differ"
  [[ -d $ck/step-00000004.corrupt && -d $ck/step-00000006 ]] && ok ||
    bad "$forged: after the run: $(ls "$ck")"
done

# A manifest resealed with 300 more parameters, each on a mesh of 2^20 devices (23 KB, it took
# 4.8 GB to read): refused over the training memory bound as its layouts are read, exit 2 with
# little memory used, and not passed over to step 2 as a corrupt one (it is whole: the bound is
# to be raised), nothing moved.
fresh
reseal "$ck/step-00000004" '
j["parameters"] += [{"name": "p%d" % i, "shape": [1], "layout": "1048576@0-1048575:R"}
                    for i in range(300)]
'
before=$(digest "$ck")
got=$(python3 - "$mc" "$ck" "$tmp/out" <<'PY'
import os, resource, subprocess, sys
env = dict(os.environ, MESHCAST_MAX_TRAIN_MEMORY_BYTES="256M")
p = subprocess.run([sys.argv[1], "train", "gpt", "--batch", "8", "--seq", "16", "--d-model", "32",
                    "--layers", "2", "--heads", "4", "--steps", "6", "--checkpoint-dir",
                    sys.argv[2], "--resume", "--out", sys.argv[3]],
                   capture_output=True, text=True, env=env)
kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(p.returncode, kib, p.stderr.strip())
PY
)
read -r rc kib err <<<"$got"
[[ $rc -eq 2 && $err == "meshcast: train memory: $ck/step-00000004/manifest.json: its parameters' layouts take over 256.00 MiB to hold (raise it with MESHCAST_MAX_TRAIN_MEMORY_BYTES)" ]] &&
  ok || bad "layouts over the memory bound: $got"
[[ $kib -lt 400000 ]] && ok || bad "layouts over the memory bound: a peak RSS of $kib KiB"
unchanged "layouts over the memory bound"

# A resealed manifest naming a parameter with an escape sequence: the line says so with '?' for
# each control character, never the raw bytes (they reached the terminal).
fresh
rm -r "$ck/step-00000002"
reseal "$ck/step-00000004" 'j["files"][0]["offsets"]["x\u001b[31m\ty"] = 0'
expect_exit 2 "parameter x?[31m y is not in the manifest" resume gpt --steps 6
err=$(resume gpt --steps 6 2>&1 >/dev/null)
[[ $err != *$'\e'* ]] && ok || bad "a raw escape byte on stderr: $err"

# DIR/latest missing, or naming an older checkpoint: the newest resumes, and stderr says why. The
# resumed steps are those of the uninterrupted run.
for damage in missing older; do
  fresh
  if [[ $damage == missing ]]; then rm "$ck/latest"; else echo step-00000002 >"$ck/latest"; fi
  resume gpt --steps 6 >"$tmp/stdout" 2>"$tmp/stderr"
  rc=$?
  rest=$(losses <"$tmp/stdout")
  err=$(cat "$tmp/stderr")
  [[ $rc -eq 0 && $err == *"resuming from the newest checkpoint, $ck/step-00000004"* ]] &&
    ok || bad "latest $damage: rc=$rc, stderr: $err"
  if [[ $damage == missing ]]; then [[ $err == *"latest is missing"* ]]; else
    [[ $err == *"latest names 'step-00000002', not the newest"* ]]; fi && ok ||
    bad "latest $damage: stderr does not say why: $err"
  close "$full" "$rest" && ok ||
    bad "latest $damage: resumed losses [$rest], uninterrupted [$full]"
  [[ $(cat "$ck/latest") == step-00000006 && -d $ck/step-00000004 ]] && ok ||
    bad "latest $damage: after the run: $(ls "$ck")"
done
# DIR/latest without any checkpoint: they were removed, starting afresh would lose the run.
fresh
rm -r "$ck"/step-*
expect_exit 2 "holds no checkpoint directory" resume gpt --steps 6

# Outputs that cannot be written: exit 4 naming the path and the reason, before training (the
# progress header, printed when training starts, never appears).
touch "$tmp/file"
for option in --out --checkpoint-dir; do
  field=${option#--}
  out_dir=(--out "$tmp/out")  # not the default, ./meshcast-out: the test leaves no directory
  [[ $option == --out ]] && out_dir=()
  expect_exit 4 "$field: cannot create $tmp/file/x: Not a directory" \
    "$mc" train gpt --steps 50 "${out_dir[@]}" "$option" "$tmp/file/x"
  out=$("$mc" train gpt --steps 50 "${out_dir[@]}" "$option" "$tmp/file/x" 2>/dev/null)
  [[ -z $out ]] && ok || bad "$option unwritable: trained first: $out"
done
# A directory where the run writes a file at its end (its JSON, a chart, DIR/latest).
mkdir -p "$tmp/od/gpt-loss.png" "$tmp/ld/latest"
expect_exit 4 "out: $tmp/od/gpt-loss.png exists and is not a regular file" \
  "$mc" train gpt --steps 50 --out "$tmp/od"
expect_exit 4 "checkpoint-dir: $tmp/ld/latest exists and is not a regular file" \
  "$mc" train gpt --steps 50 --out "$tmp/out" --checkpoint-dir "$tmp/ld"
if [[ $(id -u) -ne 0 ]]; then  # root writes into a read-only directory
  mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
  expect_exit 4 "out: cannot write in $tmp/ro: Permission denied" "$mc" train gpt --out "$tmp/ro"
fi

# Inputs: only regular JSON files as --config, strict JSON; only regular files or directories
# of them as --data, within the data limit; well-formed --stages.
mkdir "$tmp/dir"
expect_exit 2 "config: '$tmp/dir' is not a regular file" "$mc" train gpt --config "$tmp/dir"
printf '{"steps": 2, "steps": 3}' >"$tmp/twice.json"
expect_exit 2 "config: key 'steps' appears twice" "$mc" train gpt --config "$tmp/twice.json"
expect_exit 2 "data: '/dev/zero' is neither a regular file nor a directory" \
  "$mc" train gpt --data /dev/zero --out "$tmp/out"
mkfifo "$tmp/fifo"
expect_exit 2 "is neither a regular file nor a directory" \
  timeout 60 "$mc" train gpt --data "$tmp/fifo" --out "$tmp/out"
expect_exit 2 "data size: " env MESHCAST_MAX_DATA_FILE_BYTES=1000 "$mc" train gpt --out "$tmp/out"
expect_exit 2 "exceeds the limit of 1000 (raise it with MESHCAST_MAX_DATA_FILE_BYTES)" \
  env MESHCAST_MAX_DATA_FILE_BYTES=1000 "$mc" train gpt --out "$tmp/out"
for stages in "//" "dp=1/" "/dp=1" "dp=1//dp=1"; do
  expect_exit 2 "stages[" "$mc" train gpt --stages "$stages" --out "$tmp/out"
done
expect_exit 2 "stages: given empty; leave it out for the default" "$mc" train gpt --stages "" --out "$tmp/out"

# A model far over the memory limit is refused from its configuration: exit 2 naming the limit,
# with little memory used (peak RSS of the process, not time).
got=$(python3 - "$mc" "$tmp/out" <<'PY'
import resource, subprocess, sys
p = subprocess.run([sys.argv[1], "train", "gpt", "--d-model", "16384", "--layers", "64",
                    "--out", sys.argv[2]], capture_output=True, text=True)
kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(p.returncode, kib, p.stderr.strip())
PY
)
read -r rc kib err <<<"$got"
[[ $rc -eq 2 && $err == *"train memory: "*"exceeds the limit of"*"MESHCAST_MAX_TRAIN_MEMORY_BYTES"* ]] &&
  ok || bad "huge model: $got"
[[ $kib -lt 200000 ]] && ok || bad "huge model: refused with a peak RSS of $kib KiB"
# The limit applies to small models too when set below them.
expect_exit 2 "train memory: " env MESHCAST_MAX_TRAIN_MEMORY_BYTES=100000 \
  "$mc" train gpt "${small[@]}" --steps 1

# A file named as a checkpoint: refused before any work (the save of that step, at the end,
# would refuse to overwrite it and lose the run).
mkdir -p "$tmp/cf" && touch "$tmp/cf/step-00000004"
expect_exit 2 "checkpoint: $tmp/cf/step-00000004 is not a checkpoint directory" \
  "$mc" train gpt "${small[@]}" --steps 4 --checkpoint-dir "$tmp/cf"

# A resumed run's history is that of the run that saved its checkpoint: another run's JSON in
# its --out (another seed, no checkpoint directory) is not spliced in as its first steps.
fresh
base=("${small[@]:0:${#small[@]}-2}")  # (without --out)
"$mc" train gpt "${base[@]}" --steps 6 --seed 9 --out "$tmp/other" >/dev/null
"$mc" train gpt "${base[@]}" --steps 6 --out "$tmp/other" --checkpoint-dir "$ck" --resume \
  >"$tmp/stdout" 2>"$tmp/stderr"
steps=$(python3 -c 'import json,sys; print(*[s["step"] for s in json.load(sys.stdin)["steps"]])' <"$tmp/stdout")
[[ $steps == "5 6" && $(cat "$tmp/stderr") == *"holds no history of this run (it saved no checkpoint into $ck)"* ]] &&
  ok || bad "another run's history: steps [$steps], stderr: $(cat "$tmp/stderr")"

# Its own history, resumed with another learning rate and seed: kept, and a warning names what
# the earlier steps ran with (the run JSON's config is the resumed run's: it said lr 0.05 for
# steps that ran at the default, without a word).
rm -rf "$tmp/hist-ck" "$tmp/hist-out"
"$mc" train gpt "${base[@]}" --steps 2 --out "$tmp/hist-out" --checkpoint-dir "$tmp/hist-ck" \
  >/dev/null
"$mc" train gpt "${base[@]}" --steps 4 --out "$tmp/hist-out" --checkpoint-dir "$tmp/hist-ck" \
  --resume --lr 0.05 --seed 3 >"$tmp/stdout" 2>"$tmp/stderr"
steps=$(python3 -c 'import json,sys; print(*[s["step"] for s in json.load(sys.stdin)["steps"]])' <"$tmp/stdout")
[[ $steps == "1 2 3 4" && $(cat "$tmp/stderr") == *"gpt-run.json: its steps 1-2 ran with lr "*", seed 1 (this run: lr 0.05, seed 3)"* ]] &&
  ok || bad "history of other settings: steps [$steps], stderr: $(cat "$tmp/stderr")"

# The run JSON names the checkpoint directory absolute: a resume from another working directory
# with the same relative --checkpoint-dir is not another run's history.
(cd "$tmp" && "$mc" train gpt "${base[@]}" --steps 2 --out "$tmp/rel-out" --checkpoint-dir rel-ck \
  >/dev/null)
saved_in=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["checkpoint_dir"])' \
  "$tmp/rel-out/gpt-run.json")
[[ $saved_in == "$tmp/rel-ck" ]] && ok || bad "run JSON: checkpoint_dir '$saved_in', not $tmp/rel-ck"

# A directory another run is using (its lock held, as a run holds it) is refused before any
# work: the second run's saves removed the first's save in flight.
mkdir -p "$tmp/busy"
expect_exit 2 "checkpoint-dir: $tmp/busy is in use by another run" \
  flock "$tmp/busy/.lock" "$mc" train gpt "${small[@]}" --steps 2 --checkpoint-dir "$tmp/busy"
"$mc" train gpt "${small[@]}" --steps 2 --checkpoint-dir "$tmp/busy" >/dev/null &&
  ok || bad "a directory whose lock is free was refused"

# Time: a run's arithmetic is bounded before any work (--steps 16000000 of the default model is
# two weeks here), counting the steps a --resume has left: 2 of the small model's 6 are within
# 2e8 flops (61 M a step: 36 M of arithmetic with its evaluation, 2^24 for its one device, 8 M
# for its 31 K weights), 6 from the start are not.
expect_exit 2 "train flops: " "$mc" train gpt --steps 16000000 --out "$tmp/out"
# So is --plan's search, before it prices any configuration.
expect_exit 2 "train search work: " "$mc" train gpt --plan --devices 262144 --batch 262144
# Counting the devices each candidate that fits walks: 4,096 devices of a 4,096-block model
# priced for 71 s (their count alone was within the bound).
expect_exit 2 "train search work: " "$mc" train gpt --plan --devices 4096 --batch 1048576 \
  --layers 4096 --d-model 8192 --heads 128
# A pipeline's micro-batches count too, whatever the model's size (83 s a step here).
expect_exit 2 "train flops: " "$mc" train gpt --stages dp=1/dp=1/dp=1/dp=1/dp=1/dp=1/dp=1/dp=1 \
  --micro-batches 16384 --batch 16384 --seq 1 --d-model 1 --heads 1 --layers 8 --data random \
  --vocab 2 --steps 300 --out "$tmp/out"
# And tensor parallelism's collectives, one per block, micro-batch and sub-batch (3.4 s a step
# here: 368,000 steps were accepted, 15 days).
expect_exit 2 "train flops: " "$mc" train gpt --d-model 8 --heads 8 --stages tp=8 \
  --sub-batches 1024 --steps 2000 --out "$tmp/out"
# And the work per weight whatever the tokens: each step's optimizer update and gradient
# all-reduce (a 67 M-weight model of one token a step: 1 s a step, 127,000 steps were accepted,
# 35 h), and each checkpoint save (15 s for that model: 3,000 steps are within the bound, and
# as many saves, 12 h, are not).
wide=(--data random --heads 1 --layers 1 --seq 1 --vocab 1048576 --d-model 64 --batch 1)
expect_exit 2 "train flops: " "$mc" train gpt "${wide[@]}" --steps 127000 --out "$tmp/out"
expect_exit 2 "train flops: " "$mc" train gpt "${wide[@]}" --steps 3000 --checkpoint-every 1 \
  --checkpoint-dir "$tmp/wide" --out "$tmp/out"
fresh
expect_exit 2 "train flops: " env MESHCAST_MAX_TRAIN_FLOPS=200000000 \
  "$mc" train gpt "${small[@]}" --steps 6
MESHCAST_MAX_TRAIN_FLOPS=200000000 resume gpt --steps 6 >/dev/null &&
  ok || bad "a resumed run's 2 steps were counted as 6"

# Memory: a resume first loads its checkpoint, staging every device's values and moments beside
# the saved tiles it reads (1.7x the fresh run's estimate was taken unchecked). A model of 51 MB
# fresh and 104 MB resumed (peaks here: 55 and 91 MB) under a bound of 80 MB: it runs, and its
# resume is refused before any work.
tiny=(--d-model 256 --heads 4 --layers 2 --seq 4 --batch 2 --data random --stages tp=2 --json
      --out "$tmp/mem-out" --checkpoint-dir "$tmp/mem-ck")
MESHCAST_MAX_TRAIN_MEMORY_BYTES=80M "$mc" train gpt "${tiny[@]}" --steps 1 >/dev/null &&
  ok || bad "a run within the memory bound was refused"
expect_exit 2 "train memory: " env MESHCAST_MAX_TRAIN_MEMORY_BYTES=80M \
  "$mc" train gpt "${tiny[@]}" --steps 2 --resume

# A checkpoint's manifest (an offset per device and parameter) is as bounded as every file a
# load reads: one over MESHCAST_MAX_INPUT_FILE_BYTES is refused before training, not after the
# steps before the first save (which left them lost and nothing saved), and writes nothing.
expect_exit 2 "checkpoint: the manifest of each checkpoint of this run: " \
  env MESHCAST_MAX_INPUT_FILE_BYTES=4K "$mc" train gpt "${small[@]}" --steps 2 \
  --checkpoint-dir "$tmp/manifest-ck"
[[ -z $(ls -A "$tmp/manifest-ck" 2>/dev/null | grep -v '^\.lock$') ]] && ok ||
  bad "a refused manifest left: $(ls -A "$tmp/manifest-ck")"

echo "checkpoint_faults_test: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
