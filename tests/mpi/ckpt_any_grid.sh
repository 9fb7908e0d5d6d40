#!/usr/bin/env bash
# Checkpoints load into any grid: a run saved after 3 steps on each of the 15 grids of 1, 2 and 4
# ranks resumes on another grid (of another size for most) and continues with the losses of the
# run that never stopped (fp32 tolerance); on the same grid the resumed losses are bit-identical.
# (tests/test_sharded_checkpoint.cpp compares the loaded state bit for bit on all 225 pairs.)
source "$(dirname "${BASH_SOURCE[0]}")/../cli_common.sh" "$1"
# warmup_steps (10) covers all 6 steps, so max_steps 3 vs 6 does not change the learning rates.
# Attention in fp32 (train.attention_precision): with bf16 attention products (auto's choice in
# bf16 runs on AMX) a grid's 1-ulp differences in the GEMM outputs flip bf16 roundings of P and dS
# and the losses differ by ~1e-5 after one Adam step (cli_parallel.sh checks that case at bf16
# tolerance); what is tested here is the checkpoint's layout, not attention's arithmetic.
# train.gemm_layouts = rule: the uninterrupted and the stopped runs are separate processes, which
# tune would time separately (possibly another plan: the same sums in another order).
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=6
   --set train.eval_interval=0 --set train.micro_batch=4 --set train.attention_precision=fp32
   --set train.gemm_layouts=rule)
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }
run() {  # run GRID ARGS...: one rank without mpirun, else mpirun -n (product of the grid)
  local g=$1; shift
  local n=$(( $(echo "$g" | sed 's/[a-z]=//g' | tr ',' '*') ))  # "2,1,1,1" or named "c=2,d=2"
  if [ "$n" -eq 1 ]; then "$TETRAD" train "${S[@]}" --grid "$g" "$@"
  else "${MPIRUN[@]}" -n "$n" "$TETRAD" train "${S[@]}" --grid "$g" "$@"; fi
}
run 1,1,1,1 --set run.dir="$W/ref" > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
losses "$W/ref" > "$W/ref.txt"
GRIDS=(1,1,1,1 2,1,1,1 1,2,1,1 1,1,2,1 1,1,1,2 4,1,1,1 1,4,1,1 1,1,4,1 1,1,1,4 2,2,1,1 2,1,2,1
       2,1,1,2 1,2,2,1 1,2,1,2 1,1,2,2)
fails=0
close() {  # close A B: every line within 1e-5 relative, same count
  paste "$1" "$2" | awk -v n="$(wc -l < "$1")" '{ c++; d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > 1e-5) bad = 1 } END { exit (bad || c != n) }'
}
for i in "${!GRIDS[@]}"; do
  a=${GRIDS[$i]}
  b=${GRIDS[$(( (i + 5) % ${#GRIDS[@]} ))]}
  R="$W/run$i"
  if ! run "$a" --set run.dir="$R" --set train.max_steps=3 > "$W/log" 2>&1 ||
     ! run "$b" --set run.dir="$R" --resume > "$W/log2" 2>&1; then
    echo "FAIL $a -> $b: a run failed"; cat "$W/log" "$W/log2"; fails=$((fails + 1)); continue
  fi
  if ! grep -q "resumed from .*step_000003 at step 3" "$W/log2"; then
    echo "FAIL $a -> $b: did not resume from step 3"; cat "$W/log2"; fails=$((fails + 1)); continue
  fi
  losses "$R" > "$W/got.txt"
  if close "$W/ref.txt" "$W/got.txt"; then
    echo "ok   saved on $a, resumed on $b: 6 losses match the uninterrupted run"
  else
    echo "FAIL saved on $a, resumed on $b"; paste "$W/ref.txt" "$W/got.txt"; fails=$((fails + 1))
  fi
done
# The context axis (issue 28): saved on a grid with c > 1 the run resumes on one rank and on
# grids without it, and a checkpoint of a grid without it resumes on c = 2; all six losses match
# the one-rank run (the first three trained with each sequence cut into 2c chunks).
for pair in "c=2 1,1,1,1" "c=2,d=2 2,1,1,1" "1,1,1,2 c=2" "c=4 x=2,c=2"; do
  read -r a b <<< "$pair"
  R="$W/ctx_${a//[=,]/_}"
  if ! run "$a" --set run.dir="$R" --set train.max_steps=3 > "$W/log" 2>&1 ||
     ! run "$b" --set run.dir="$R" --resume > "$W/log2" 2>&1; then
    echo "FAIL $a -> $b: a run failed"; cat "$W/log" "$W/log2"; fails=$((fails + 1)); continue
  fi
  losses "$R" > "$W/got.txt"
  if grep -q "resumed from .*step_000003 at step 3" "$W/log2" && close "$W/ref.txt" "$W/got.txt"; then
    echo "ok   saved on $a, resumed on $b: 6 losses match the one-rank run"
  else
    echo "FAIL saved on $a, resumed on $b"; cat "$W/log2"; paste "$W/ref.txt" "$W/got.txt"; fails=$((fails + 1))
  fi
done
# Same grid: bit-identical to that grid's uninterrupted run.
# (one rank and 1,1,2,1 are checked by tests/ckpt_cli.sh's SIGTERM resume)
for g in 2,1,1,2; do
  run "$g" --set run.dir="$W/u$g" > "$W/log" 2>&1 &&
  run "$g" --set run.dir="$W/s$g" --set train.max_steps=3 > "$W/log" 2>&1 &&
  run "$g" --set run.dir="$W/s$g" --resume > "$W/log2" 2>&1 || { cat "$W/log" "$W/log2"; fails=$((fails + 1)); continue; }
  if cmp -s <(losses "$W/u$g") <(losses "$W/s$g") && [ "$(losses "$W/s$g" | wc -l)" -eq 6 ]; then
    echo "ok   grid $g: resumed losses bit-identical to the uninterrupted run"
  else
    echo "FAIL grid $g: not bit-identical"; paste <(losses "$W/u$g") <(losses "$W/s$g"); fails=$((fails + 1))
  fi
done
echo "$fails failed"
[ $fails -eq 0 ]
