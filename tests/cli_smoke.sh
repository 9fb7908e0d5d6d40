#!/usr/bin/env bash
# End-to-end through the `tetrad` binary: prepare -> train -> resume -> eval -> generate ->
# export, and bad input on the command line failing with a clear message and exit status 1.
set -uo pipefail
TETRAD=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$(dirname "$0")/checks.sh"

for i in $(seq 1 300); do
  echo "the king went up to the city $i, and the people followed him unto the river."
  [ $((i % 7)) -eq 0 ] && echo
done > "$W/corpus.txt"

check "prepare" "$TETRAD" prepare --input "$W/corpus.txt" --out "$W/data" --vocab-size 320 --val-fraction 0.2
check "meta.json written" test -f "$W/data/meta.json"
# `tetrad cpu`: what precision auto picks and why (both GEMM rates where it measured), the peaks
# MFU divides by; measured into a cache of its own, then read back from it. Unforced: CI's
# second stage runs this test with TETRAD_PRECISION_AUTO set, and a forced choice measures nothing.
check "cpu: precision auto with its reason, the MFU peaks" bash -c "TETRAD_CACHE_DIR='$W/cache' env -u TETRAD_PRECISION_AUTO '$TETRAD' cpu > '$W/cpu.txt' && grep -q '^precision auto: \(fp32\|bf16\) (' '$W/cpu.txt' && grep -q '^MFU peak, fp32: [0-9]* GFLOP/s' '$W/cpu.txt' && grep -q '^MFU peak, bf16: ' '$W/cpu.txt'"
check "cpu: the measurement read back from the cache" bash -c "TETRAD_CACHE_DIR='$W/cache' env -u TETRAD_PRECISION_AUTO '$TETRAD' cpu | grep -q '^precision auto: .*\(cached in $W/cache\|bf16 would be emulated\)'"

T=(--set model.name=tiny --set data.dir="$W/data" --set run.dir="$W/run" --set train.seq_len=32
   --set train.eval_interval=5 --set train.eval_batches=2 --set train.checkpoint_interval=5)
check "train 10 steps" "$TETRAD" train "${T[@]}" --set train.max_steps=10
check "resolved config saved" grep -q "max_steps = 10" "$W/run/config.toml"
check "metrics written" test "$(grep -c '"loss"' "$W/run/metrics.jsonl")" -eq 10
check "resume to 15" "$TETRAD" train "${T[@]}" --set train.max_steps=15 --resume
check "resumed 5 more steps" test "$(grep -c '"loss"' "$W/run/metrics.jsonl")" -eq 15
check "eval" "$TETRAD" eval --model "$W/run" --data "$W/data" --seq-len 32 --batches 2
check "generate" "$TETRAD" generate --model "$W/run" --prompt "the king" --max-new 10 --temperature 0.8 --top-k 20
check "export" "$TETRAD" export --model "$W/run" --out "$W/hf"
check "exported safetensors" test -f "$W/hf/model.safetensors"

expect_error "unknown config key" "unknown key 'train.lrr'" "$TETRAD" train "${T[@]}" --set train.lrr=1
expect_error "missing data" "tetrad prepare" "$TETRAD" train --set model.name=tiny --set data.dir="$W/nope"
expect_error "missing input" "$W/missing.txt" "$TETRAD" prepare --input "$W/missing.txt" --out "$W/d2"
expect_error "sequence too long" "model.max_seq" "$TETRAD" train "${T[@]}" --set train.seq_len=65
expect_error "bad grad_comm_precision" "train.grad_comm_precision = \"fp16\": expected \"fp32\" or \"bf16\"" "$TETRAD" train "${T[@]}" --set train.grad_comm_precision=fp16
expect_error "bad gemm_layouts" "train.gemm_layouts = \"fast\": expected \"auto\", \"rule\", \"tune\" or a plan" "$TETRAD" train "${T[@]}" --set train.gemm_layouts=fast
expect_error "bad bench --gemm-layouts" "--gemm-layouts \"fast\": expected \"auto\", \"rule\" or \"tune\"" "$TETRAD" bench --configs tiny --gemm-layouts fast
printf '[train]\nlr = = 1\n' > "$W/bad.toml"
expect_error "malformed config" "line 2" "$TETRAD" train --config "$W/bad.toml"

cp -r "$W/data" "$W/trunc"
shard="$W/trunc/train_000000.bin"
truncate -s $(( $(stat -c %s "$shard") - 10 )) "$shard"
expect_error "truncated shard" "truncated" "$TETRAD" train "${T[@]}" --set data.dir="$W/trunc" --set run.dir="$W/run2"

# Data made with another tokenizer than the model's.
"$TETRAD" prepare --input "$W/corpus.txt" --out "$W/data_other" --vocab-size 300 > /dev/null
expect_error "tokenizer mismatch" "tokenizer" "$TETRAD" eval --model "$W/run" --data "$W/data_other" --seq-len 32

# A checkpoint of another family / shape.
expect_error "wrong family checkpoint" "llama" "$TETRAD" train --set model.name=llama-tiny --set data.dir="$W/data" \
  --set run.dir="$W/run3" --set run.init_from="$W/hf" --set train.seq_len=32

# tetrad plan: a ranked table for a shipped machine, JSON that parses, the published rows, and
# a clear error for an unknown machine.
plan_out=$("$TETRAD" plan --model small --machine perlmutter --ranks 8 --global-batch 8 --micro-batch 8 2>&1)
check "plan table" grep -q "valid grids (x y z p d), fastest first" <<<"$plan_out"
check "plan marks pipeline grids" grep -q "pipeline: not trainable yet\|^ *[0-9]* *[0-9]*x[0-9]*x[0-9]*x[2-8]x" <<<"$plan_out"
check "plan json" bash -c "\"$TETRAD\" plan --model tiny --machine frontier --ranks 4 --json - | python3 -c 'import json,sys; j=json.load(sys.stdin); assert j[\"grids\"] and j[\"grids\"][0][\"valid\"]'"
check "plan published" bash -c "\"$TETRAD\" plan --published | grep -q 'Megatron-LM.*| 163 |'"
check "plan sweep lists pipeline grids" bash -c "\"$TETRAD\" plan --sweep-grids 4 | grep -q -- '--grid 1,1,1,4,1 .*--accumulate'"
check "plan interleaved" bash -c "\"$TETRAD\" plan --model small --machine perlmutter --ranks 8 --global-batch 16 --micro-batch 2 --schedule interleaved --virtual-stages 2 | grep -q 'pipeline interleaved x2'"
printf '[model]\nname = "small"\n[train]\nrecompute = "full"\n' > "$W/plan.toml"
check "plan takes recompute and ZeRO from the config" bash -c "\"$TETRAD\" plan --model \"$W/plan.toml\" --machine perlmutter --ranks 8 -s parallel.zero=1 | grep -q 'recompute full, ZeRO 1'"
check "plan: the command line wins over the config" bash -c "\"$TETRAD\" plan --model \"$W/plan.toml\" --machine perlmutter --ranks 8 -s parallel.zero=1 --recompute none --zero 0 | grep -q 'recompute none, ZeRO 0'"
expect_error "plan virtual stages need interleaving" "needs parallel.schedule" "$TETRAD" plan --model small --machine perlmutter --virtual-stages 2
expect_error "plan unknown machine" "expected a .toml file or one of" "$TETRAD" plan --model small --machine nowhere
# tetrad plan --scaling: the table, JSON with every point, a well-formed SVG with the reference
# points, weak scaling with a model per point, and refusals (docs/planner.md, "Scaling curves").
S=(--machine perlmutter --global-batch 256 --micro-batch-per-replica 4 --seq 1024 --precision bf16)
scal_out=$("$TETRAD" plan --scaling strong --model gpt2-124m --ranks 8,16,32 "${S[@]}" 2>&1)
check "plan scaling table" grep -q "TFLOP/s/GPU" <<<"$scal_out"
check "plan scaling first point 100%" grep -qE '^ +8 .* 100\.0% ' <<<"$scal_out"
printf '[{"ranks": 8, "pflops": 0.4, "label": "measured"}, {"ranks": 32, "efficiency": 0.9, "label": "measured"}]' > "$W/refs.json"
check "plan scaling json" bash -c "\"$TETRAD\" plan --scaling strong --model gpt2-124m --ranks 8,16,32 ${S[*]} --json - | python3 -c 'import json,sys; j=json.load(sys.stdin); p=j[\"points\"]; assert len(p)==3 and p[0][\"efficiency\"]==1 and all(k in p[2] for k in (\"grid\",\"step_s\",\"tokens_per_s\",\"pflops\",\"mfu\",\"hfu\",\"limit\"))'"
check "plan scaling svg" bash -c "\"\$@\" > /dev/null" _ "$TETRAD" plan --scaling strong --model gpt2-124m --ranks 8,16,32 "${S[@]}" --points "$W/refs.json" --svg "$W/curve.svg"
check "plan scaling svg parses" python3 -c "import sys, xml.etree.ElementTree as E; r=E.parse(sys.argv[1]).getroot(); assert r.tag.endswith('svg') and len(r.findall('.//{http://www.w3.org/2000/svg}polyline'))==2" "$W/curve.svg"
check "plan weak scaling, a model per point" bash -c "\"$TETRAD\" plan --scaling weak --model gpt-5b,gpt-10b --ranks 512,1024 --machine perlmutter --global-batch 2048 --micro-batch 2048 --precision bf16 --recompute full --overlap tensor --no-pipeline | grep -q 'gpt-10b'"
printf '[model]\nname = "small"\nn_layer = 12\n' > "$W/plan12.toml"
check "plan weak scaling, TOML configs per point" bash -c "\"$TETRAD\" plan --scaling weak --model \"$W/plan.toml\",\"$W/plan12.toml\" --ranks 8,16 --machine perlmutter --global-batch 64 | grep -q 'plan12.toml'"
check "plan chooses the micro-batch without --micro-batch" bash -c "\"$TETRAD\" plan --model small --machine perlmutter --ranks 8 --global-batch 64 | grep -q 'micro-batch chosen per grid'"
expect_error "plan scaling TOML list, missing file" "entry 2" "$TETRAD" plan --scaling weak --model "$W/plan.toml,$W/nowhere.toml" --ranks 8,16 --machine perlmutter --global-batch 64
check "plan --why a rejected grid lists its memory" bash -c "\"$TETRAD\" plan --model gpt-80b --machine perlmutter --ranks 4 --global-batch 4 --precision bf16 --why 1,1,1,1,4 | grep -q 'rejected: does not fit'"
expect_error "plan --why a grid of other ranks" "the grid has 4 ranks" "$TETRAD" plan --model small --machine perlmutter --ranks 8 --why 1,1,1,1,4
expect_error "plan ranks list needs --scaling" "needs --scaling" "$TETRAD" plan --model small --machine perlmutter --ranks 8,16
expect_error "plan scaling needs ranks" "--scaling needs --ranks" "$TETRAD" plan --scaling weak --model small --machine perlmutter
expect_error "plan strong scaling one model" "strong scaling keeps one model" "$TETRAD" plan --scaling strong --model small,tiny --ranks 4,8 --machine perlmutter --global-batch 8

# bench in both precisions: MFU against the peak of the arithmetic the run uses, named; the phase
# list names each phase once (issue 15: "other" was printed twice).
for prec in fp32 bf16; do
  "$TETRAD" bench --configs tiny --steps 2 --warmup 1 --threads 1 --precision $prec --anchor none \
    --json "$W/bench_$prec.jsonl" > "$W/bench_$prec.txt" 2>&1
  want=$([ $prec = bf16 ] && echo "bf16 matrix peak" || echo "fp32 FMA peak")
  check "bench $prec: MFU against the $want" grep -q "MFU: .*% of the $want (" "$W/bench_$prec.txt"
  check "bench $prec: each phase once" bash -c "grep 'compute by phase' '$W/bench_$prec.txt' | tr ',' '\n' | sed 's/^ *//; s/ [0-9.]*%//; s/.*: //' | sort | uniq -d | grep -q . && exit 1 || exit 0"
  check "bench $prec: JSON names the peak" python3 -c "import json,sys; j=[json.loads(l) for l in open(sys.argv[1])][1]; assert j['mfu_peak'].startswith(sys.argv[2]) and j['mfu'] > 0, j" "$W/bench_$prec.jsonl" "$want"
  # The model-shape GEMM ceiling is measured before and after the steps: either a fraction with
  # both windows and their spread, or (windows more than 20% apart, or the step above the best)
  # the flag and no fraction. Which one depends on the machine's clock: the format is checked.
  g=$([ $prec = bf16 ] && echo "the bf16 GEMM" || echo "sgemm")
  check "bench $prec: GEMM ceiling before and after the steps, or flagged unstable" grep -Eq "^  GEMM ceiling: +([0-9.]+% of $g on this model's shapes \([0-9.]+ GFLOP/s, each shape's best of before the steps [0-9.]+ and after [0-9.]+: spread [0-9.]+%\)|ceiling unstable: before [0-9.]+, after [0-9.]+ GFLOP/s \($g on this model's shapes, measured before and after the steps: spread [0-9.]+%.*\); no fraction of it is given)$" "$W/bench_$prec.txt"
  check "bench $prec: JSON has both ceiling windows; no fraction when unstable" python3 -c "import json,sys; j=[json.loads(l) for l in open(sys.argv[1])][1]; b, a = j['gemm_ceiling_before_gflops'], j['gemm_ceiling_after_gflops']; assert b > 0 and a > 0 and j['gemm_ceiling_gflops'] >= min(a, b), j; assert abs(j['gemm_ceiling_spread'] - abs(a - b) / min(a, b)) < 1e-9, j; assert (j['frac_gemm_ceiling'] is None) == j['gemm_ceiling_unstable'], j" "$W/bench_$prec.jsonl"
done
check "bench: the bf16 matrix peak is among the ceilings" grep -q "bf16 matrix peak, 1 thr" "$W/bench_fp32.txt"
# bf16: the model's GEMM layout plan is printed (tuned where bf16 GEMMs are native, else the
# rule, saying why) and recorded in the JSON.
check "bench bf16: the gemm layouts line" grep -q "gemm layouts.*\[--gemm-layouts auto: " "$W/bench_bf16.txt"
check "bench bf16: JSON has the plan" python3 -c "import json,sys; j=[json.loads(l) for l in open(sys.argv[1])][1]; assert j['gemm_layouts'].startswith('qkv:') and j['gemm_layouts_source'] in ('tuned', 'rule'), j" "$W/bench_bf16.jsonl"

# bench on a device backend (issue 18): cpu-strict runs the model on device memory the host cannot
# read, so this is the path `tetrad bench --device cuda` takes on a GPU; --batch and --seq set the
# shape; what cannot be honoured is refused.
"$TETRAD" bench --device cpu-strict --configs tiny --batch 2 --seq 32 --steps 2 --warmup 1 --threads 1 \
  --anchor none --json "$W/bench_strict.jsonl" > "$W/bench_strict.txt" 2>&1
check "bench --device cpu-strict: names the device" grep -q "^device: cpu-strict" "$W/bench_strict.txt"
check "bench --device cpu-strict: the formula's memory on the device" grep -q "memory: *on cpu-strict: .* MiB by the formula" "$W/bench_strict.txt"
check "bench --device cpu-strict: JSON device, batch, seq, tokens/s" python3 -c "import json,sys; j=[json.loads(l) for l in open(sys.argv[1])][1]; assert j['device'] == 'cpu-strict' and j['batch'] == 2 and j['seq'] == 32 and j['tokens_per_s'] > 0 and j['mfu'] > 0, j" "$W/bench_strict.jsonl"
expect_error "bench unknown device" "bogus" "$TETRAD" bench --device bogus --configs tiny --steps 1 --warmup 0 --anchor none
expect_error "bench negative batch" "--batch -1: expected a positive count" "$TETRAD" bench --batch -1 --configs tiny
expect_error "bench seq beyond max_seq" "--seq 65: expected 1..64" "$TETRAD" bench --seq 65 --configs tiny --steps 1 --warmup 0 --anchor none
expect_error "bench --grids refuses --device" "the grid sweep runs on the CPU only" "$TETRAD" bench --grids --device cpu-strict

echo "$fails failed"
[ $fails -eq 0 ]
