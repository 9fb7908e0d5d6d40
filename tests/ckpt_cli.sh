#!/usr/bin/env bash
# Checkpoints through the `tetrad` binary: SIGTERM writes a final checkpoint, exits 0 and the
# resumed run is bit-identical to one never stopped (one rank, and 2 ranks signalled like a
# scheduler does); damaged checkpoints (a flipped byte, a truncated shard, deleted metadata) are
# refused with a clear message and the previous good one used; another model config is refused;
# export to a Hugging Face folder and import back give bit-identical logits.
source "$(dirname "${BASH_SOURCE[0]}")/cli_common.sh" "$1"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
N=400
# train.gemm_layouts = rule: the uninterrupted and the stopped runs are separate processes, which
# tune would time separately (possibly another plan: the same sums in another order); the tuned
# resume is checked below against a run given the stopped run's plan.
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=$N
   --set train.eval_interval=0 --set train.log_interval=100000 --set train.gemm_layouts=rule)
wait_steps() {
  for _ in $(seq 1 600); do n=$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null); [ "${n:-0}" -ge "$2" ] && return 0; sleep 0.05; done
  return 1
}

# ---- SIGTERM, one rank and two ----
for mode in serial mpi; do
  if [ $mode = serial ]; then G=(--grid 1,1,1,1); L=(); else G=(--grid 1,1,2,1); L=("${MPIRUN[@]}" -n 2); fi
  "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --set run.dir="$W/ref_$mode" > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
  "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --set run.dir="$W/term_$mode" > "$W/log" 2>&1 &
  pid=$!
  wait_steps "$W/term_$mode" 20
  if [ $mode = serial ]; then kill -TERM "$pid"; else kill -TERM $(pgrep -P "$pid"); fi
  wait "$pid"; rc=$?
  stopped=$(sed -n 's/.*stopping at step \([0-9]*\).*/\1/p' "$W/log" | head -1)
  if [ $rc -eq 0 ] && [ -n "$stopped" ] && [ "$stopped" -lt $N ] &&
     "$TETRAD" verify --model "$W/term_$mode" > /dev/null; then
    ok "$mode: SIGTERM at step $stopped: final checkpoint verified, exit status 0"
  else
    bad "$mode: SIGTERM (status $rc, stopped at '${stopped}')"; cat "$W/log"
  fi
  "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --set run.dir="$W/term_$mode" --resume > "$W/log" 2>&1 || { cat "$W/log"; bad "$mode: resume"; }
  if cmp -s <(losses "$W/ref_$mode") <(losses "$W/term_$mode") && [ "$(losses "$W/term_$mode" | wc -l)" -eq $N ]; then
    ok "$mode: resumed run's $N losses bit-identical to the uninterrupted run"
  else
    bad "$mode: resumed losses differ"; diff <(losses "$W/ref_$mode") <(losses "$W/term_$mode") | head
  fi
done

# ---- tuned GEMM layouts (bf16): the checkpoint keeps the plan and the resumed run reuses it ----
# The stopped run tunes at its start; its resumption takes the checkpoint's plan (said in the log);
# an uninterrupted run given that plan (train.gemm_layouts = the plan's text) has the same bits.
# Where bf16 GEMMs are emulated tune runs the rule (said in the log) and the same checks hold.
TU=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=$N
    --set train.eval_interval=0 --set train.log_interval=100000 --set train.precision=bf16
    --set train.attention_precision=fp32)
"$TETRAD" train "${TU[@]}" --set train.gemm_layouts=tune --set run.dir="$W/term_tune" > "$W/log_tune" 2>&1 &
pid=$!
wait_steps "$W/term_tune" 20
kill -TERM "$pid"; wait "$pid" || bad "tune: SIGTERM run failed"
grep -q "gemm layouts" "$W/log_tune" || bad "tune: no gemm layouts line in the log"
"$TETRAD" train "${TU[@]}" --set train.gemm_layouts=tune --set run.dir="$W/term_tune" --resume > "$W/log" 2>&1 || { cat "$W/log"; bad "tune: resume"; }
meta=$(ls -d "$W"/term_tune/checkpoints/step_* | head -1)/meta.json
plan=$(tr -d '\n' < "$meta" | grep -o '"gemm_layouts":"[^"]*"' | head -1 | cut -d'"' -f4)
src=$(tr -d '\n' < "$meta" | grep -o '"gemm_layouts_source":"[^"]*"' | head -1 | cut -d'"' -f4)
if [ -n "$plan" ]; then
  "$TETRAD" train "${TU[@]}" --set train.gemm_layouts="$plan" --set run.dir="$W/ref_tune" > "$W/log2" 2>&1 || { cat "$W/log2"; bad "tune: run given the plan"; }
fi
if { [ "$src" != tuned ] && [ "$src" != checkpoint ] || grep -q "on resume: the checkpoint's" "$W/log"; } &&
   grep -q "gemm layouts (given)" "$W/log2" && [ -n "$plan" ] &&
   cmp -s <(losses "$W/ref_tune") <(losses "$W/term_tune") && [ "$(losses "$W/term_tune" | wc -l)" -eq $N ]; then
  ok "tune ($src): the resumed run reuses the checkpoint's plan; $N losses bit-identical to an uninterrupted run with that plan"
else
  bad "tune ($src): resumed losses differ or the plan was not reused"; grep "gemm layouts" "$W/log" "$W/log2"
  diff <(losses "$W/ref_tune") <(losses "$W/term_tune") | head
fi

# ---- damaged checkpoints ----
D=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.eval_interval=0
   --set train.checkpoint_interval=2 --set train.keep_checkpoints=5)
"$TETRAD" train "${D[@]}" --set run.dir="$W/dmg" --set train.max_steps=6 > /dev/null 2>&1 || bad "train for damage tests"
ck="$W/dmg/checkpoints"
cp -r "$W/dmg" "$W/dmg_orig"
# A flipped byte in the latest checkpoint's shard: verify names the chunk; resume falls back.
python3 - "$ck/step_000006/shard_00000.bin" <<'PY'
import sys
f = open(sys.argv[1], "r+b"); f.seek(64 + 5000); b = f.read(1); f.seek(64 + 5000); f.write(bytes([b[0] ^ 0x01]))
PY
out=$("$TETRAD" verify --model "$W/dmg" 2>&1)
if [ $? -eq 1 ] && grep -q "checksum of chunk 0" <<<"$out"; then ok "flipped byte: verify refuses ($(grep -o 'checksum of chunk 0.*' <<<"$out" | cut -c1-120))"; else bad "flipped byte: verify: $out"; fi
out=$("$TETRAD" train "${D[@]}" --set run.dir="$W/dmg" --set train.max_steps=8 --resume 2>&1)
if [ $? -eq 0 ] && grep -q "step_000006 refused" <<<"$out" && grep -q "resumed from .*step_000004 at step 4" <<<"$out"; then
  ok "flipped byte: resume refuses step 6 and uses step 4"
else bad "flipped byte resume: $out"; fi
# A truncated shard: refused before loading, previous one used.
rm -rf "$W/dmg"; cp -r "$W/dmg_orig" "$W/dmg"
truncate -s -100 "$ck/step_000006/shard_00000.bin"
out=$("$TETRAD" train "${D[@]}" --set run.dir="$W/dmg" --set train.max_steps=8 --resume 2>&1)
if [ $? -eq 0 ] && grep -q "truncated" <<<"$out" && grep -q "resumed from .*step_000004" <<<"$out"; then
  ok "truncated shard: refused ($(grep -o 'shard_00000.bin has [^)]*)' <<<"$out" | head -1)), step 4 used"
else bad "truncated shard: $out"; fi
# The metadata deleted.
rm -rf "$W/dmg"; cp -r "$W/dmg_orig" "$W/dmg"
rm "$ck/step_000006/meta.json"
out=$("$TETRAD" verify --model "$W/dmg" 2>&1)
[ $? -eq 1 ] && grep -q "meta.json is missing" <<<"$out" && ok "metadata deleted: verify refuses" || bad "verify without metadata: $out"
out=$("$TETRAD" train "${D[@]}" --set run.dir="$W/dmg" --set train.max_steps=8 --resume 2>&1)
if [ $? -eq 0 ] && grep -q "meta.json is missing" <<<"$out" && grep -q "resumed from .*step_000004" <<<"$out"; then
  ok "metadata deleted: refused, step 4 used"
else bad "metadata deleted: $out"; fi
# Another model config: refused with the differences, nothing loaded.
rm -rf "$W/dmg"; cp -r "$W/dmg_orig" "$W/dmg"
out=$("$TETRAD" train "${D[@]}" --set run.dir="$W/dmg" --set train.max_steps=8 --set model.n_layer=3 --resume 2>&1)
if [ $? -eq 1 ] && grep -q "model.n_layer: checkpoint 2, config 3" <<<"$out"; then ok "changed config: refused (model.n_layer: checkpoint 2, config 3)"; else bad "changed config: $out"; fi
out=$("$TETRAD" train "${D[@]}" --set run.dir="$W/dmg" --set train.max_steps=8 --set train.seq_len=16 --resume 2>&1)
if [ $? -eq 1 ] && grep -q "train.seq_len = 32" <<<"$out"; then ok "changed seq_len: refused"; else bad "changed seq_len: $out"; fi

# ---- export / import ----
rm -rf "$W/dmg"; cp -r "$W/dmg_orig" "$W/dmg"
"$TETRAD" export --model "$W/dmg" --out "$W/hf" > /dev/null &&
"$TETRAD" import --hf "$W/hf" --out "$W/imported" > /dev/null &&
"$TETRAD" verify --model "$W/imported" > /dev/null || bad "export/import commands"
for m in "$W/dmg" "$W/hf" "$W/imported"; do
  "$TETRAD" logits --model "$m" --tokens 1,5,9,33,2,7 --out "$m.logits" > /dev/null || bad "logits of $m"
done
if cmp -s "$W/dmg.logits" "$W/hf.logits" && cmp -s "$W/hf.logits" "$W/imported.logits"; then
  ok "export to HF and import back: bit-identical logits"
else bad "export/import logits differ"; fi
# The imported run trains on from step 0 (zero moments) on a grid.
"${MPIRUN[@]}" -n 2 "$TETRAD" train "${D[@]}" --set run.dir="$W/imported" --set train.max_steps=2 --grid 2,1,1,1 --resume > "$W/log" 2>&1 &&
  grep -q "resumed from .*step_000000 at step 0" "$W/log" && ok "imported model resumes on grid 2,1,1,1" || { bad "imported resume"; cat "$W/log"; }
echo "$fails failed"
[ $fails -eq 0 ]
