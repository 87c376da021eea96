#!/usr/bin/env bash
# Tests of `meshcast sync` on the in-process backend: every mode moves every element of the
# shipped manifests (--verify --json: verified true, 0 mismatches), a cast to bf16 and f16, an
# explicit manifest with partial sums, uneven shards and a cast in every mode, a sync saved by
# --save-plan and run by --plan, --predict's JSON, and bad input (exit 2, exactly one line on
# stderr naming the field).
# Usage: tests/tools/sync_test.sh path/to/meshcast
set -u
# Debian's python3 itself: a version manager's shim first on PATH costs ~0.4 s a call.
[[ -x /usr/bin/python3 ]] && python3() { /usr/bin/python3 "$@"; }
MC=${1:?usage: sync_test.sh path/to/meshcast}
MC=$(cd "$(dirname "$MC")" && pwd)/$(basename "$MC")
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
run() {
  timeout 300 "$MC" sync "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
}
field() {  # values of keys in the one JSON line of $TMP/out
  python3 -c 'import json,sys
obj = json.loads(open(sys.argv[1]).read())
print(" ".join(json.dumps(obj.get(k, "MISSING")) for k in sys.argv[2:]))' "$TMP/out" "$@" \
    2>/dev/null || echo NOJSON
}

# Good runs: every element checked on every generator.
while read -r model system extra; do
  [[ -z $model ]] && continue
  # shellcheck disable=SC2086
  run --model "models/$model" --system "models/systems/$system" --iters 1 --verify --json $extra
  got=$(field verified mismatches)
  if [[ $rc -eq 0 && $got == "true 0" ]]; then ok; else
    bad "$model $system $extra: rc=$rc $got $(head -c 300 "$TMP/err")"; fi
done <<'EOF2'
gpt2-small.json tp2pp2-to-tp2dp2.json --mode fused
gpt2-small.json tp2pp2-to-tp2dp2.json --mode per-tensor
gpt2-small.json tp2pp2-to-tp2dp2.json --mode gather
gpt2-small.json tp2pp2-to-tp2dp2.json --cast bf16 --max-staging-bytes 1M
gpt2-small.json tp2pp2-to-tp2dp2.json --cast F16 --strategy sendrecv
moe-tiny.json ep4pp2-to-tp4.json --mode fused
moe-tiny.json ep4pp2-to-tp4.json --mode per-tensor --max-staging-bytes 64K
gpt2-small.json dp3-to-dp5.json --topology meshes/emulated-2x4-nic.json
gpt2-small.json dp3-to-dp5.json --topology meshes/emulated-2x4-nic.json --no-fork
EOF2

# An explicit manifest: partial sums, uneven shards, a cast, overlapping meshes.
cat >"$TMP/explicit.json" <<'EOF2'
{"embed": {"shape": [50257, 64], "dtype": "F32", "src": "4@0-3:S0R", "dst": "2x3@2-7:RS1", "dst_dtype": "bf16"},
 "grad": {"shape": [7, 9, 5], "dtype": "f64", "src": "2x2@0-3:S0RR+P1", "dst": "3@5-7:RS0R"},
 "norm": {"shape": [64], "dtype": "BF16", "src": "4@0-3:R", "dst": "6@2-7:R"},
 "step": {"shape": [], "dtype": "I64", "src": "1@0:", "dst": "8@0-7:R"}}
EOF2
for mode in fused per-tensor gather; do
  run --model "$TMP/explicit.json" --mode "$mode" --verify --json --iters 1
  got=$(field verified mismatches tensors)
  if [[ $rc -eq 0 && $got == "true 0 4" ]]; then ok; else bad "explicit $mode: rc=$rc $got $(cat "$TMP/err")"; fi
done

# A saved sync (--save-plan) runs as the flags did (--plan): the explicit manifest with its cast,
# partial sums and uneven shards in gather mode, and a model config with a cast and a strategy on
# a preset topology; the same prediction as from the flags, every element verified.
while read -r label args; do
  [[ -z $label ]] && continue
  args=${args//\$TMP/$TMP}
  # shellcheck disable=SC2086
  run $args --predict --json
  want=$(field predicted_seconds messages boxes bytes_moved tensors)
  # shellcheck disable=SC2086
  run $args --save-plan "$TMP/saved.json"
  saved_rc=$rc
  run --plan "$TMP/saved.json" --predict --json
  got=$(field predicted_seconds messages boxes bytes_moved tensors)
  run --plan "$TMP/saved.json" --iters 1 --verify --json
  if [[ $saved_rc -eq 0 && $rc -eq 0 && $got == "$want" && $(field verified mismatches) == "true 0" ]]
  then ok; else bad "saved $label: rc=$saved_rc/$rc '$got' vs '$want' $(head -c 300 "$TMP/err")"; fi
done <<'EOF2'
explicit --model $TMP/explicit.json --mode gather
config --model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --cast bf16 --strategy sendrecv --topology dgx-a100
EOF2
# Device ids far apart: the local backend runs a thread per device of the model, not per id up
# to the largest (60,001 threads before).
printf '{"t": {"shape": [8, 8], "dtype": "F32", "src": "2@[0,1]:S0R", "dst": "2@[1,60000]:RS0"}}' >"$TMP/far.json"
run --model "$TMP/far.json" --iters 1 --verify --json
if [[ $rc -eq 0 && $(field verified mismatches) == "true 0" ]]; then ok; else
  bad "far ids: rc=$rc $(field verified mismatches) $(head -c 300 "$TMP/err")"; fi
# A local sync too large to plan is refused before a thread per device plans it at once: within
# 1 GB of address space, where 128 threads' stacks do not fit (they started, and each priced the
# model, 1.1 GB and 6 s for 1,000 tensors, before all refused). Not under a sanitizer, whose
# shadow memory needs more.
if ! nm -D "$MC" 2>/dev/null | grep -qE "__(asan|tsan)_init"; then
  python3 -c 'import json; print(json.dumps({f"t{i}": {"shape": [1031 + i], "dtype": "F32",
    "src": "128@0-127:S0", "dst": "128@0-127:R"} for i in range(200)}))' >"$TMP/wide.json"
  (
    ulimit -v 1000000
    MESHCAST_MAX_PLAN_MEMORY_BYTES=1G OPENBLAS_NUM_THREADS=1 run --model "$TMP/wide.json" --iters 1
    echo "$rc" >"$TMP/rc"
  )
  rc=$(cat "$TMP/rc")
  if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q "^meshcast: plan memory: .*(a device's share" "$TMP/err"
  then ok; else bad "local sync too large to plan: rc=$rc $(head -c 300 "$TMP/err")"; fi
fi
# bench/uneven_model.py, the planner's hard case in docs/sync.md, still writes a model that plans.
python3 bench/uneven_model.py --partial >"$TMP/uneven.json"
run --model "$TMP/uneven.json" --predict --json
if [[ $rc -eq 0 && $(field tensors boxes) == "1000 536320" ]]; then ok; else
  bad "uneven model: rc=$rc $(field tensors boxes) $(head -c 300 "$TMP/err")"; fi
python3 bench/uneven_model.py --random >"$TMP/random.json"  # no two layouts alike
run --model "$TMP/random.json" --predict --json
if [[ $rc -eq 0 && $(field tensors boxes) == "1000 1883655" ]]; then ok; else
  bad "random model: rc=$rc $(field tensors boxes) $(head -c 300 "$TMP/err")"; fi
# DeepSeek-V3 from 4,096 trainers to 4,096 generators predicts within the plan bounds (auto's
# choices, each priced alone, did not fit together: it ran out of memory after 45 s).
printf '{"train": {"num_gpus": 4096, "tp_size": 1, "dp_size": 1024, "ep_size": 16, "pp_size": 4},
 "generation": {"num_gpus": 4096, "tp_size": 8, "dp_size": 512}}' >"$TMP/ds4096.json"
run --model models/deepseek-v3.json --system "$TMP/ds4096.json" --predict --json
if [[ $rc -eq 0 && $(field tensors) == 1025 ]]; then ok; else
  bad "4096 -> 4096 predict: rc=$rc $(field tensors) $(head -c 300 "$TMP/err")"; fi
# The saved plan fixes what it was made with; a file of something else is refused.
run --model "$TMP/explicit.json" --save-plan "$TMP/saved.json"
run --model "$TMP/explicit.json" --mode gather --strategy sendrecv --max-staging-bytes 1M \
  --save-plan "$TMP/saved2.json"
printf '{"a": 1}' >"$TMP/notsaved.json"
sed 's/"meshcast_sync_plan": *1/"meshcast_sync_plan": 2/' "$TMP/saved.json" >"$TMP/v2.json"
sed 's/"meshcast_sync_plan": *1/"meshcast_sync_plan": 1, "meshcast_sync_plan": 1/' \
  "$TMP/saved.json" >"$TMP/twice.json"
{ cat "$TMP/saved.json"; printf '\0{"tensors": {}}'; } >"$TMP/nul.json"
head -c 100 "$TMP/saved.json" >"$TMP/cut.json"
# A value the file fixes, edited to a bad one, is named as the file's field.
sed 's/"mode": *"fused"/"mode": "sideways"/' "$TMP/saved.json" >"$TMP/badmode.json"
sed 's/"max_staging_bytes": *[0-9]*/"max_staging_bytes": 0/' "$TMP/saved.json" >"$TMP/badstaging.json"
# A key meshcast never writes (here "fork" mistyped, which would have run with chains that fork).
sed 's/"fork": *true/"frok": false/' "$TMP/saved.json" >"$TMP/badkey.json"
# A topology without its placement: named as the file's field, not as --topology.
sed 's/"single_host": *true/"single_hots": true/' "$TMP/saved.json" >"$TMP/badtopo.json"
# A tensor's field is named as the plan file's, not a model file's.
sed 's/"dtype": *"BF16"/"dtype": "BF61"/' "$TMP/saved.json" >"$TMP/baddtype.json"
# An expert group missing its first experts: named for what is missing, not the model's size.
printf '{"model.layers.0.mlp.experts.2.up_proj.weight": {"shape": [3, 5], "dtype": "F32"},
  "model.layers.0.mlp.experts.3.up_proj.weight": {"shape": [3, 5], "dtype": "F32"}}' >"$TMP/experts.json"
while IFS='|' read -r want args; do
  [[ -z $want ]] && continue
  # shellcheck disable=SC2086
  run ${args//\$TMP/$TMP}
  if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q -- "$want" "$TMP/err"; then ok; else
    bad "saved plan '$args': want exit 2 naming '$want', got rc=$rc: $(cat "$TMP/err")"; fi
done <<'EOF2'
mode|--plan $TMP/saved.json --mode per-tensor
mode|--plan $TMP/saved2.json --mode fused
strategy|--plan $TMP/saved2.json --strategy auto
max-staging-bytes|--plan $TMP/saved2.json --max-staging-bytes 64M
model|--plan $TMP/saved.json --model models/gpt2-small.json
topology|--plan $TMP/saved.json --topology dgx-a100
save-plan|--plan $TMP/saved.json --save-plan $TMP/again.json
plan|--plan $TMP/notsaved.json
plan: .* format 2|--plan $TMP/v2.json
plan: .*appears twice|--plan $TMP/twice.json
plan: .*NUL byte|--plan $TMP/nul.json
plan: not valid JSON: unterminated string at byte 100|--plan $TMP/cut.json
plan.mode: expected fused, per-tensor or gather, got 'sideways' (in |--plan $TMP/badmode.json
plan.max_staging_bytes: must be at least 8|--plan $TMP/badstaging.json
plan.frok: unknown key (a saved sync has meshcast_sync_plan, mode|--plan $TMP/badkey.json
plan.tensors.norm.dtype: unknown dtype 'BF61'|--plan $TMP/baddtype.json
plan.topology.single_hots: unknown key|--plan $TMP/badtopo.json
save-plan: saves the sync and exits, pricing nothing|--model $TMP/explicit.json --predict --save-plan $TMP/both.json
experts.up_proj.weight: expert 0 of 4 is missing|--model $TMP/experts.json --system models/systems/tp2pp2-to-tp2dp2.json --predict
topology|--model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --topology auto --save-plan $TMP/auto.json
model|--iters 1
EOF2
# The topology the plan was saved with, given again, is not another one: it runs.
run --plan "$TMP/saved.json" --topology single-host --predict --json
if [[ $rc -eq 0 && $(field tensors) != MISSING ]]; then ok; else
  bad "--plan with its own topology: rc=$rc $(cat "$TMP/err")"; fi
# A saved plan's cast is applied to its f32 tensors whose target dtype was edited out, as the
# report says; one whose layouts were edited out is refused as the saved plan's fault.
run --model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --cast bf16 \
  --save-plan "$TMP/cast.json"
python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
p = json.load(open(d + "/cast.json"))
for t in p["tensors"].values():
    t.pop("dst_dtype", None)
json.dump(p, open(d + "/cast-nodtype.json", "w"))
for t in p["tensors"].values():
    t.pop("src"), t.pop("dst")
json.dump(p, open(d + "/nolayouts.json", "w"))
PY
run --plan "$TMP/cast.json" --predict --json
want=$(field cast bytes_moved)
run --plan "$TMP/cast-nodtype.json" --predict --json
if [[ $rc -eq 0 && $(field cast bytes_moved) == "$want" && $want == '"bf16" 501132288' ]]; then ok; else
  bad "saved cast without target dtypes: rc=$rc $(field cast bytes_moved) (want $want)"; fi
# A tensor that opts out of the cast (dst_dtype F32) stays out of it when the plan is replayed.
printf '{"a": {"shape": [64], "dtype": "F32", "dst_dtype": "F32", "src": "1@0:R", "dst": "1@1:R"},
 "b": {"shape": [64], "dtype": "F32", "src": "1@0:R", "dst": "1@1:R"}}' >"$TMP/optout.json"
run --model "$TMP/optout.json" --cast bf16 --predict --json
want=$(field bytes_moved)
run --model "$TMP/optout.json" --cast bf16 --save-plan "$TMP/optout-saved.json"
run --plan "$TMP/optout-saved.json" --predict --json
if [[ $rc -eq 0 && $(field bytes_moved) == "$want" && $want == 384 ]]; then ok; else
  bad "saved cast with an opted-out tensor: rc=$rc $(field bytes_moved) (want $want)"; fi
run --plan "$TMP/nolayouts.json" --predict
if [[ $rc -eq 2 && $(cat "$TMP/err") == "meshcast: plan.tensors: every tensor needs its src and dst layouts" ]]
then ok; else bad "saved plan without layouts: rc=$rc $(cat "$TMP/err")"; fi
run --plan "$TMP/saved2.json" --max-staging-bytes 1024K --iters 1 --verify --json  # its value
if [[ $rc -eq 0 && $(field mode verified) == '"gather" true' ]]; then ok; else
  bad "saved plan, its own staging bound respelled: rc=$rc $(cat "$TMP/err")"; fi

# --predict: any size, nothing run.
run --model models/qwen2.5-0.5b.json --system models/systems/tp2pp2-to-tp2dp2.json \
  --topology meshes/emulated.json --predict --json
got=$(field mode tensors verified)
if [[ $rc -eq 0 && $got == '"fused" 290 "MISSING"' ]] &&
  python3 -c 'import json,sys; o=json.load(open(sys.argv[1]))
assert o["predicted_seconds"] >= o["link_bound_seconds"] > 0 and o["bytes_moved"] > 0' "$TMP/out"; then
  ok; else bad "predict: rc=$rc $got $(cat "$TMP/err")"; fi

# Gather mode casts at the gather's senders: both of its steps carry half the bytes.
run --model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --mode gather \
  --predict --json
full=$(field bytes_moved)
run --model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --mode gather \
  --cast bf16 --predict --json
if [[ $rc -eq 0 && $((2 * $(field bytes_moved))) == "$full" ]]; then ok; else
  bad "gather --cast bf16: rc=$rc $(field bytes_moved), want half of $full"; fi

# A trainer beside a generator, a NIC per device: chains fork at the trainers, whose three NICs
# then carry what leaves host 0, where plain chains (--no-fork) send it all through the
# generator's. A saved plan keeps the choice, and refuses --no-fork if it was made without.
colocated=(--model models/gpt2-small.json --system models/systems/dp3-to-dp5.json
  --topology meshes/emulated-2x4-nic.json)
run "${colocated[@]}" --predict --json
forked=$(field fork link_bound_seconds busiest_link)
run "${colocated[@]}" --predict --json --no-fork
plain=$(field fork link_bound_seconds busiest_link)
if [[ $forked == 'true 2.142388224 "host mc-host0 nic 0 out"' &&
  $plain == 'false 3.982073856 "host mc-host0 nic 3 out"' ]]; then ok; else
  bad "forked chains: $forked, plain: $plain"; fi
run "${colocated[@]}" --no-fork --save-plan "$TMP/nofork.json"
run --plan "$TMP/nofork.json" --predict --json
if [[ $rc -eq 0 && $(field fork link_bound_seconds busiest_link) == "$plain" ]]; then ok; else
  bad "saved --no-fork: rc=$rc $(field fork link_bound_seconds busiest_link)"; fi
run "${colocated[@]}" --save-plan "$TMP/forked.json"
run --plan "$TMP/forked.json" --predict --no-fork
if [[ $rc -eq 2 && $(cat "$TMP/err") == "meshcast: no-fork: the saved plan $TMP/forked.json was made without it; leave --no-fork out to run it" ]]
then ok; else bad "--no-fork against a saved plan that forks: rc=$rc $(cat "$TMP/err")"; fi
sed 's/"fork":true/"fork":"yes"/' "$TMP/forked.json" >"$TMP/fork-text.json"
run --plan "$TMP/fork-text.json" --predict
if [[ $rc -eq 2 && $(cat "$TMP/err") == "meshcast: plan.fork: not a boolean" ]]; then ok; else
  bad "a saved plan's fork not a boolean: rc=$rc $(cat "$TMP/err")"; fi

# Bad input: exit 2, one line, naming the field.
printf '{"a": {"shape": [4], "dtype": "F7"}}' >"$TMP/dtype.json"
printf '{"a": {"shape": [4], "dtype": "F32", "src": "1@0:R", "dst": "1@1:R"}, "b": {"shape": [4], "dtype": "F32"}}' >"$TMP/mixed.json"
printf '{"train": {"num_gpus": 4, "tp_size": 3}, "generation": {"num_gpus": 2}}' >"$TMP/degrees.json"
printf '{"a": {"shape": [4], "dtype": "F32", "src": "1@0:S0S0", "dst": "1@1:R"}}' >"$TMP/layout.json"
printf '{"a": {"shape": [4], "dtype": "F32"}, "a": {"shape": [4], "dtype": "F32"}}' >"$TMP/dup.json"
printf '{"train": {"num_gpus": 4, "tp_size": 2, "pp_size": 2, "vpp_size": 2}, "generation": {"num_gpus": 2}}' >"$TMP/vpp.json"
printf '{"train": {"num_gpus": 4, "tp_size": 2, "pp_size": 2, "decoder_first_pipeline_num_layers": 3}, "generation": {"num_gpus": 2}}' >"$TMP/uneven.json"
printf '{"train": {"num_gpus": 4, "tp_size": 2, "pp_size": 2}, "generation": {"num_gpus": 2, "num_layers_per_virtual_pipeline_stage": 1}}' >"$TMP/virtual.json"
printf '{"train": {"num_gpus": 65536, "tp_size": 8, "pp_size": 4, "dp_size": 2048}, "generation": {"num_gpus": 65536, "tp_size": 4, "dp_size": 16384}}' >"$TMP/huge.json"
# A prediction is bounded by what it keeps: gpt2-small between meshes of 65,536 devices lists 3.4 M
# messages to 21 M receivers (2.5 GB when predicted; estimated at 2.90 GiB, over a 2 GB bound).
MESHCAST_MAX_PLAN_MEMORY_BYTES=2000000000 run --model models/gpt2-small.json --system "$TMP/huge.json" --predict
if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q "^meshcast: plan memory: an estimated" "$TMP/err"; then ok; else
  bad "65536 predict under 2 GB: rc=$rc $(head -c 300 "$TMP/err")"; fi
# ... and not refused for what it does not keep: 64 tensors, each from one device to 65,536
# replicas, list 4.2 M receivers in 64 chains (97 MB when predicted; estimated at 260 MiB, and at
# 868 MiB when each receiver was taken for 160 bytes).
for i in $(seq 0 63); do printf '"t%d": {"shape": [%d], "dtype": "F32", "src": "1@0:R", "dst": "65536@1-65536:R"}\n' "$i" $((1000 + i)); done |
  paste -sd, | sed 's/.*/{&}/' >"$TMP/wide.json"
MESHCAST_MAX_PLAN_MEMORY_BYTES=400M run --model "$TMP/wide.json" --predict --json
if [[ $rc -eq 0 && $(field tensors messages) == "64 1" ]]; then ok; else
  bad "65536 replicas predict under 400 MB: rc=$rc $(field tensors messages) $(head -c 300 "$TMP/err")"; fi
printf '{"w": {"shape": [8], "dtype": "F8_E4M3", "dst_dtype": "F8_E5M2", "src": "2@0-1:S0", "dst": "2@2-3:R"}}' >"$TMP/f8.json"
printf '{"w": {"shape": [8], "dtype": "I8", "dst_dtype": "F8_E4M3", "src": "2@0-1:S0", "dst": "2@2-3:R"}}' >"$TMP/i8f8.json"
# 2^50 bytes (the most a model may have) to 8,192 and 16,384 replicas: 2^63 and 2^64 bytes moved.
printf '{"a": {"shape": [140737488355328], "dtype": "F64", "src": "1@0:R", "dst": "8192@1-8192:R"}}' >"$TMP/eib8.json"
sed 's/8192@1-8192/16384@1-16384/' "$TMP/eib8.json" >"$TMP/eib16.json"
printf '{"b": {"shape": [8], "dtype": "F32", "src": "2@0-1:S0", "dst": "2@2-3:R"}, "big": {"shape": [3000000000], "dtype": "F32", "src": "2@0-1:S0", "dst": "2@2-3:S0"}}' >"$TMP/big.json"
while IFS='|' read -r want args; do
  [[ -z $want ]] && continue
  # shellcheck disable=SC2086
  run $args
  if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q -- "$want" "$TMP/err"; then ok; else
    bad "bad input '$args': want exit 2 naming '$want', got rc=$rc: $(cat "$TMP/err")"; fi
done <<EOF2
tensors.a.dtype|--model $TMP/dtype.json --system models/systems/tp2pp2-to-tp2dp2.json
model: the sync would move more than 2^63 bytes|--model $TMP/eib8.json --predict --json
model: the sync would move more than 2^63 bytes|--model $TMP/eib16.json --predict --mode per-tensor
tensors.b|--model $TMP/mixed.json
system.train.tp_size|--model models/gpt2-small.json --system $TMP/degrees.json
tensors.a.src|--model $TMP/layout.json
system.train.vpp_size: not supported|--model models/gpt2-small.json --system $TMP/vpp.json
system.train.decoder_first_pipeline_num_layers: not supported|--model models/gpt2-small.json --system $TMP/uneven.json
system.generation.num_layers_per_virtual_pipeline_stage: not supported|--model models/gpt2-small.json --system $TMP/virtual.json
verify|--model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --predict --verify
model|--model $TMP/dup.json --system models/systems/tp2pp2-to-tp2dp2.json
system|--model models/gpt2-small.json
cast|--model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --cast f64
mode|--model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --mode bogus
max-staging-bytes|--model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --max-staging-bytes 0
max-staging-bytes: .*at most 1.00 TiB, got '2T'|--model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --max-staging-bytes 2T
buffer bytes: .* the largest: tensors.big (source)|--model $TMP/big.json
tensors.w.dst_dtype: a tensor of dtype F8_E4M3 cannot become F8_E5M2|--model $TMP/f8.json
tensors.w.dst_dtype: a tensor of dtype I8 cannot become F8_E4M3|--model $TMP/i8f8.json
EOF2

# An 8-bit float that keeps its dtype under a cast is saved by its name (not as its storage,
# i8) and runs again from the saved plan; a saved plan of 100,000 tensors is written and read
# in time linear in them (an ordered tree of the document took minutes at 500,000).
printf '{"w": {"shape": [8], "dtype": "F8_E4M3", "src": "2@0-1:S0", "dst": "2@2-3:R"}, "v": {"shape": [8], "dtype": "F32", "src": "2@0-1:S0", "dst": "2@2-3:R"}}' >"$TMP/f8cast.json"
run --model "$TMP/f8cast.json" --cast bf16 --save-plan "$TMP/f8cast-plan.json"
run --plan "$TMP/f8cast-plan.json" --iters 1 --verify --json
if [[ $rc -eq 0 && $(field verified mismatches) == "true 0" ]] &&
  grep -q '"w":{[^}]*"dst_dtype":"F8_E4M3"' "$TMP/f8cast-plan.json"; then ok; else
  bad "F8_E4M3 under --cast, saved and run: rc=$rc $(head -c 300 "$TMP/err")"; fi
python3 -c 'import sys
open(sys.argv[1], "w").write("{" + ",".join("\"t%d\":{\"shape\":[1],\"dtype\":\"U8\",\"src\":\"1@0:R\",\"dst\":\"1@1:R\"}" % i for i in range(100000)) + "}")' "$TMP/many.json"
run --model "$TMP/many.json" --save-plan "$TMP/many-plan.json"
run --plan "$TMP/many-plan.json" --predict --json
if [[ $rc -eq 0 && $(field tensors) == "100000" ]]; then ok; else
  bad "a saved plan of 100,000 tensors: rc=$rc $(head -c 300 "$TMP/err")"; fi
# Read against the bound on planning memory as they are read: refused within it, at once.
MESHCAST_MAX_PLAN_MEMORY_BYTES=100M run --model "$TMP/many.json" --predict
if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] &&
  grep -q "^meshcast: plan memory: tensor 34134 of the model would exceed the limit of 100.00 MiB" "$TMP/err"
then ok; else bad "100,000 tensors under 100 MiB: rc=$rc $(cat "$TMP/err")"; fi
sed 's/"max_staging_bytes":[0-9]*/"max_staging_bytes":18446744073709551615/' "$TMP/f8cast-plan.json" >"$TMP/staging.json"
run --plan "$TMP/staging.json" --predict
if [[ $rc -eq 2 && $(cat "$TMP/err") == "meshcast: plan.max_staging_bytes: integer out of range" ]]
then ok; else bad "a saved plan's max_staging_bytes past 2^63: rc=$rc $(cat "$TMP/err")"; fi

# A bound in bytes from the environment takes a binary unit; the refusal names the tensor.
while IFS='|' read -r value want; do
  MESHCAST_MAX_PLAN_MEMORY_BYTES=$value run --model models/gpt2-small.json \
    --system models/systems/tp2pp2-to-tp2dp2.json --predict
  if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q -- "$want" "$TMP/err"; then ok; else
    bad "MESHCAST_MAX_PLAN_MEMORY_BYTES=$value: want exit 2 naming '$want', got rc=$rc: $(cat "$TMP/err")"; fi
done <<'EOF2'
1M|^meshcast: plan memory: .* exceeds the limit of 1.00 MiB .*; the largest: tensors.model.embed_tokens.weight
1.5G|^meshcast: MESHCAST_MAX_PLAN_MEMORY_BYTES: expected bytes as digits with an optional K, M, G or T
EOF2

# The gather mode's whole-tensor buffers count on the local backend too: 32 generators of a
# 256 MiB tensor need 16.5 GiB of them beside 0.5 GiB of tiles.
printf '{"w": {"shape": [67108864], "dtype": "F32", "src": "1@0:S0", "dst": "32@1-32:S0"}}' >"$TMP/g32.json"
MESHCAST_MAX_BUFFER_BYTES=1G run --model "$TMP/g32.json" --mode gather --iters 1
if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] &&
  grep -q "^meshcast: buffer bytes: .* the largest: the gather mode's whole-tensor buffers" "$TMP/err"
then ok; else bad "gather scratch on the local backend: rc=$rc $(cat "$TMP/err")"; fi

for flag in cast topology plan save-plan; do  # given empty: refused, not taken for the default
  run --model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --$flag ''
  if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q -- "^meshcast: $flag: given empty" "$TMP/err"
  then ok; else bad "empty --$flag: rc=$rc $(cat "$TMP/err")"; fi
done

# Many devices on the local backend: each part's planning bound counts the process's own memory
# once (an even share of the whole bound refused any sync from about 511 devices).
printf '{"t": {"shape": [1], "dtype": "U8", "src": "1@0:R", "dst": "600@1-600:R"}}' >"$TMP/wide.json"
run --model "$TMP/wide.json" --iters 1 --verify --json
if [[ $rc -eq 0 && $(field verified) == true ]]; then ok; else
  bad "a sync to 600 devices: rc=$rc $(head -c 300 "$TMP/err")"; fi

# The run-transfers bound counts what each mode sends: per tensor, a message per box and
# receiver (10 all-gathers over 64 devices: 40,320 an iteration), fused at least one per tensor
# and target device (640).
python3 -c 'import json
print(json.dumps({f"t{i}": {"shape": [64], "dtype": "F32", "src": "64@0-63:S0", "dst": "64@0-63:R"}
                  for i in range(10)}))' >"$TMP/gathers.json"
MESHCAST_MAX_RUN_TRANSFERS=100000 run --model "$TMP/gathers.json" --mode per-tensor --iters 3
if [[ $rc -eq 2 ]] && grep -q "^meshcast: run transfers: 3 iterations and the warm-up, each of 4[0-9]* transfers" "$TMP/err"
then ok; else bad "per-tensor run transfers: rc=$rc $(head -c 300 "$TMP/err")"; fi
MESHCAST_MAX_RUN_TRANSFERS=100000 run --model "$TMP/gathers.json" --iters 3 --verify --json
if [[ $rc -eq 0 && $(field verified) == true ]]; then ok; else
  bad "fused within run transfers: rc=$rc $(head -c 300 "$TMP/err")"; fi

# ... and a cast or a pending sum split in a piece per bucket (a quarter of the staging bound):
# 65,536 floats under 8 bytes of staging are 65,536 messages an iteration, not one (a million
# iterations would have run for 70 hours).
printf '{"w": {"shape": [65536], "dtype": "F32", "src": "2@0-1:R+P0", "dst": "1@2:R"}}' >"$TMP/psum.json"
printf '{"w": {"shape": [65536], "dtype": "F32", "src": "1@0:R", "dst": "1@1:R"}}' >"$TMP/one.json"
for args in "--model $TMP/psum.json" "--model $TMP/one.json --cast bf16"; do
  run $args --max-staging-bytes 8 --iters 1000000
  if [[ $rc -eq 2 ]] && grep -q "^meshcast: run transfers: 1000000 iterations and the warm-up, each of 65536 transfers" "$TMP/err"
  then ok; else bad "pieces in run transfers ($args): rc=$rc $(head -c 300 "$TMP/err")"; fi
done
run --model "$TMP/one.json" --cast bf16 --max-staging-bytes 64K --iters 2 --verify --json
if [[ $rc -eq 0 && $(field verified) == true ]]; then ok; else
  bad "a cast within run transfers: rc=$rc $(head -c 300 "$TMP/err")"; fi

# An explicit entry's keys are all meshcast's: a misspelt dst_dtype is refused, not a sync uncast.
printf '{"w": {"shape": [64], "dtype": "F32", "src": "1@0:S0", "dst": "2@1-2:S0", "dst_dtyp": "bf16"}}' >"$TMP/typo.json"
run --model "$TMP/typo.json" --iters 1
if [[ $rc -eq 2 && $(cat "$TMP/err") == "meshcast: tensors.w.dst_dtyp: unknown key of an explicit entry (expected shape, dtype, src, dst, dst_dtype)" ]]
then ok; else bad "a misspelt key of an explicit entry: rc=$rc $(cat "$TMP/err")"; fi

# Iterations are bounded by what they move in all (a run of hours is refused before it starts).
MESHCAST_MAX_RUN_BYTES=1M run --model models/gpt2-small.json --system models/systems/tp2pp2-to-tp2dp2.json --iters 3
if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q "^meshcast: run bytes: 3 iterations and the warm-up, each of .*, exceed the limit of 1.00 MiB" "$TMP/err"
then ok; else bad "sync iterations over the run bound: rc=$rc $(cat "$TMP/err")"; fi

# ... and by their transfers: 2,000 one-element tensors a million times, tensor by tensor, would
# run for 16 hours.
python3 -c 'import sys
open(sys.argv[1], "w").write("{" + ",".join("\"t%d\":{\"shape\":[1],\"dtype\":\"F32\",\"src\":\"1@0:R\",\"dst\":\"1@1:R\"}" % i for i in range(2000)) + "}")' "$TMP/t2k.json"
run --model "$TMP/t2k.json" --mode per-tensor --iters 1000000
if [[ $rc -eq 2 && $(cat "$TMP/err") == "meshcast: run transfers: 1000000 iterations and the warm-up, each of 2000 transfers, exceed the limit of 134217728 (raise it with MESHCAST_MAX_RUN_TRANSFERS)" ]]
then ok; else bad "sync transfers over the run bound: rc=$rc $(cat "$TMP/err")"; fi
# Every device of the local backend holds its own plan of every tensor: 1,024 devices' plans of
# 4,000 tensors on meshes of 512 are refused at once (each device held 12 KB a tensor there;
# the run-transfers bound, which 1,024 threads on this machine's cores exceed too, lifted).
python3 -c 'import sys
open(sys.argv[1], "w").write("{" + ",".join("\"t%d\":{\"shape\":[1],\"dtype\":\"U8\",\"src\":\"512@0-511:R\",\"dst\":\"512@512-1023:R\"}" % i for i in range(4000)) + "}")' "$TMP/wide.json"
MESHCAST_MAX_RUN_TRANSFERS=1000000000000 run --model "$TMP/wide.json" --iters 1
if [[ $rc -eq 2 && $(cat "$TMP/err") == "meshcast: plan memory: 1024 devices' plans of 4000 tensors, an estimated 58.59 GiB, exceed the limit of 8.00 GiB (raise it with MESHCAST_MAX_PLAN_MEMORY_BYTES)" ]]
then ok; else bad "1,024 devices' plans of 4,000 tensors: rc=$rc $(cat "$TMP/err")"; fi

# Gather holds three plans a tensor (gather, broadcast, slice): counted so (it peaked at twice
# the bound that fused, one a tensor, kept to).
MESHCAST_MAX_PLAN_MEMORY_BYTES=30M run --model "$TMP/t2k.json" --mode gather --iters 1
if [[ $rc -eq 2 ]] && grep -q "^meshcast: plan memory: 2 devices' plans of 2000 tensors, an estimated 35.4[0-9] MiB, exceed the limit of 30.00 MiB" "$TMP/err"
then ok; else bad "gather's plans: rc=$rc $(cat "$TMP/err")"; fi
MESHCAST_MAX_PLAN_MEMORY_BYTES=30M run --model "$TMP/t2k.json" --mode fused --iters 1
if [[ $rc -eq 0 ]]; then ok; else bad "fused's plans: rc=$rc $(cat "$TMP/err")"; fi

# Per-tensor and gather report the busiest link of the step that bounds them, not the first
# step's (a link that carried 1 byte).
printf '{"small":{"shape":[1],"dtype":"U8","src":"1@0:R","dst":"1@1:R"},"big":{"shape":[100000000],"dtype":"U8","src":"1@2:R","dst":"1@3:R"}}' >"$TMP/links.json"
for mode in fused per-tensor gather; do
  run --model "$TMP/links.json" --mode "$mode" --predict --json
  if [[ $rc -eq 0 && $(field busiest_link) == '"device 2 send"' ]]; then ok; else
    bad "busiest link of $mode: rc=$rc $(field busiest_link) $(cat "$TMP/err")"; fi
done

# A name's control characters are not printed (the error is one line of printable text).
printf '{"x\\u001b[31m\\u000bq.layers.1234567890.w":{"shape":[4],"dtype":"F32"}}' >"$TMP/ctl.json"
run --model "$TMP/ctl.json" --system models/systems/tp2pp2-to-tp2dp2.json --predict
if [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && ! LC_ALL=C grep -q '[[:cntrl:]]' <(tr -d '\n' <"$TMP/err") &&
  grep -q "has more than 9 digits" "$TMP/err"; then ok; else
  bad "control characters in a name: rc=$rc $(cat -v "$TMP/err")"; fi

run --model "$TMP/missing.json"  # I/O: exit 4, the path and the reason
if [[ $rc -eq 4 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q "missing.json" "$TMP/err"; then ok; else
  bad "missing model file: rc=$rc $(cat "$TMP/err")"; fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
