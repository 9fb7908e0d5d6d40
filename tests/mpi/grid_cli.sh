#!/usr/bin/env bash
# The grid a 2-rank `tetrad train` runs on (parallel/grid.hpp, train/auto_grid.hpp): a config
# that names no grid gets the planner's choice and says why (not the 1x1x1x1 default that does
# not fit 2 ranks); the named form `--grid d=2` trains exactly like `--grid 1,1,1,2`; a grid
# that does not match the ranks, and a named grid with an unknown or repeated axis, are refused
# naming what is wrong; a context axis with a sequence that does not cut into 2c chunks is
# refused by name; eval on a context grid gives one rank's loss, generate is refused by name.
source "$(dirname "${BASH_SOURCE[0]}")/../cli_common.sh" "$1"
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=3
   --set train.eval_interval=0 --set train.gemm_layouts=rule)
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; shift; [ $# -gt 0 ] && cat "$@"; fails=$((fails + 1)); }

# No grid named, 2 ranks: chosen, said why, trained, and the chosen grid is recorded.
if "${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/none" > "$W/log_none" 2>&1 &&
   grep -q "^parallel.grid is not set and 2 ranks were launched: choosing one" "$W/log_none" &&
   grep -q "^grid auto: .*first choice" "$W/log_none" &&
   [ "$(losses "$W/none" | wc -l)" -eq 3 ]; then
  chosen=$(grep '^grid = ' "$W/none/config.toml" | tr -d "\"' " | cut -d= -f2)
  if [ -n "$chosen" ] && [ "$(tr ',' '\n' <<<"$chosen" | awk '{ p *= $1 } BEGIN { p = 1 } END { print p }')" = 2 ]; then
    ok "no grid on 2 ranks: the planner's choice $chosen, said why, recorded in config.toml"
  else
    bad "no grid on 2 ranks: config.toml records grid '$chosen'" "$W/none/config.toml" "$W/log_none"
  fi
else
  bad "no grid on 2 ranks" "$W/log_none"
fi

# The named form is the positional grid: the same losses, bit for bit.
"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/pos" --grid 1,1,1,2 > "$W/log_pos" 2>&1 &&
"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/named" --grid d=2 > "$W/log_named" 2>&1 ||
  bad "positional or named grid did not train" "$W/log_pos" "$W/log_named"
if [ -s "$W/pos/metrics.jsonl" ] && cmp -s <(losses "$W/pos") <(losses "$W/named"); then
  ok "--grid d=2 trains as --grid 1,1,1,2 (the same losses)"
else
  bad "--grid d=2 against --grid 1,1,1,2"; paste <(losses "$W/pos") <(losses "$W/named")
fi

# Refusals: an explicit grid is never replaced by a chosen one.
expect_refusal() {  # NAME PATTERN GRID
  local out
  out=$("${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/refused" --grid "$3" 2>&1)
  if grep -q -- "$2" <<<"$out" && ! grep -q "first choice" <<<"$out"; then ok "$1"; else bad "$1: $out"; fi
}
expect_refusal "explicit grid 2,2,1,1 on 2 ranks refused" "grid 2x2x1x1 needs 4 ranks but mpirun started 2" 2,2,1,1
expect_refusal "explicit grid 1,1,1,1 on 2 ranks refused" "grid 1x1x1x1 needs 1 ranks but mpirun started 2" 1,1,1,1
expect_refusal "named grid with an unknown axis refused" 'unknown axis "q"' d=2,q=1
expect_refusal "named grid with a repeated axis refused" "axis d is named twice" d=2,d=1
# The context axis (issue 28): a sequence that does not cut into 2c chunks, and the inference
# commands on a grid with c > 1, are refused naming the numbers and the way out.
out=$("${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/refused" --grid c=2 --set train.seq_len=30 2>&1)
if grep -q "seq_len 30 is not divisible by 4 (set train.seq_len to a multiple of 4" <<<"$out" ||
   grep -q "sequence length 30 is not divisible by 4 (set train.seq_len to a multiple of 4" <<<"$out"; then
  ok "c=2 with train.seq_len 30 refused (not 2c = 4 chunks)"
else
  bad "c=2 with train.seq_len 30: $out"
fi
# eval on a context grid: each rank its chunks of every sequence, the loss one rank's (to the
# printed digits); generate refused by name with the way out.
one=$("$TETRAD" eval --model "$W/pos" --data "$W/data" --seq-len 32 --batches 2 --micro-batch 2 2>&1 | grep '^loss')
out=$("${MPIRUN[@]}" -n 2 "$TETRAD" eval --model "$W/pos" --data "$W/data" --seq-len 32 --batches 2 --micro-batch 2 --grid c=2 2>&1)
if [ -n "$one" ] && [ "$(grep '^loss' <<<"$out")" = "$one" ]; then
  ok "eval --grid c=2 gives one rank's loss ($one)"
else
  bad "eval --grid c=2: one rank '$one', c=2: $out"
fi
out=$("${MPIRUN[@]}" -n 2 "$TETRAD" eval --model "$W/pos" --data "$W/data" --seq-len 30 --grid c=2 2>&1)
if grep -q "sequence length 30 is not divisible by 4 (give --seq-len a multiple of 4" <<<"$out"; then
  ok "eval --grid c=2 --seq-len 30 refused (not 2c = 4 chunks)"
else
  bad "eval --grid c=2 --seq-len 30: $out"
fi
out=$("${MPIRUN[@]}" -n 2 "$TETRAD" generate --model "$W/pos" --prompt "the king" --max-new 4 --grid c=2 2>&1)
if grep -q "context-parallel axis (c = 2) is not supported by .generate. (.eval. and .logits. run on c grids" <<<"$out" &&
   grep -q "give x,y,z,d" <<<"$out"; then
  ok "generate --grid c=2 refused by name"
else
  bad "generate --grid c=2: $out"
fi
# logits on a context grid: each rank its two chunks of the sequence, the chunks' logits put back
# in sequence order: one rank's logits (within fp32 rounding: attention over the chunks); a
# length that does not cut into 2c chunks refused naming both.
toks=5,9,13,2,7,11,3,8,1,4,6,10
"$TETRAD" logits --model "$W/pos" --tokens "$toks" --out "$W/logits1.bin" > /dev/null 2>&1
out=$("${MPIRUN[@]}" -n 2 "$TETRAD" logits --model "$W/pos" --tokens "$toks" --out "$W/logits2.bin" --grid c=2 2>&1)
cmp=$(python3 - "$W/logits1.bin" "$W/logits2.bin" <<'PY' 2>&1
import struct, sys
a, b = (open(f, "rb").read() for f in sys.argv[1:3])
if len(a) != len(b) or not a: print("sizes", len(a), len(b)); sys.exit(1)
n = len(a) // 4
x, y = struct.unpack(f"<{n}f", a), struct.unpack(f"<{n}f", b)
d = max(abs(p - q) for p, q in zip(x, y))
print(f"max |diff| {d:.3g} over {n} logits"); sys.exit(0 if d < 1e-4 else 1)
PY
)
if [ $? -eq 0 ]; then ok "logits --grid c=2 gives one rank's logits ($cmp)"; else bad "logits --grid c=2: $cmp; $out"; fi
out=$("${MPIRUN[@]}" -n 2 "$TETRAD" logits --model "$W/pos" --tokens 5,9,13,2,7,11 --out "$W/logits3.bin" --grid c=2 2>&1)
if grep -q "2 x c = 4 chunks, but --tokens gives 6 tokens" <<<"$out"; then
  ok "logits --grid c=2 with 6 tokens refused (not 2c = 4 chunks)"
else
  bad "logits --grid c=2 with 6 tokens: $out"
fi
exit $((fails > 0))
