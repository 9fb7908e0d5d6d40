#!/usr/bin/env bash
# Checkpoints reshard over the expert fold E (docs/moe.md, "Expert parallelism"): a mixture of
# experts (mixtral-tiny, dropless, aux and z losses) saved after 3 steps with its experts split
# over E = 2 resumes at E = 1 (one rank, and two data ranks) and at E = 4 (four ranks), saved at
# E = 4 resumes at E = 2, saved at E = 1 resumes at E = 2 (set by parallel.expert_parallel),
# saved with the experts also split over X (x=2,d=2,e=2) resumes on one rank; with the expert
# bias and the shared expert, saved at E = 2 resumes at E = 1:
# every run's 6 losses match the one-rank run that never stopped (fp32 tolerance). On the same
# grid d=2,e=2 the resumed losses are bit-identical to its uninterrupted run.
source "$(dirname "${BASH_SOURCE[0]}")/../cli_common.sh" "$1"
# As ckpt_any_grid.sh: warm-up covers the 6 steps, fp32 (the MoE block's only precision), the
# rule's GEMM layouts.
S=(--set model.name=mixtral-tiny --set data.dir="$W/data" --set train.seq_len=32
   --set train.max_steps=6 --set train.eval_interval=0 --set train.micro_batch=4
   --set train.precision=fp32 --set train.attention_precision=fp32 --set train.gemm_layouts=rule
   --set model.router_z_loss_coef=0.01)
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_resume_common.sh"
resumes d=2,e=2 1,1,1,1
resumes d=2,e=2 1,1,1,2
resumes d=2,e=2 d=4,e=4
resumes d=4,e=4 d=2,e=2
resumes 1,1,1,2 d=2 --set parallel.expert_parallel=2
resumes x=2,d=2,e=2 1,1,1,1
resumes_bit_identical d=2,e=2
# The expert bias (a buffer the optimizer leaves alone, updated after each step) and the shared
# expert: saved on E = 2, resumed on one rank (E = 1), like the one-rank run with both that never
# stopped. The rate (0.05) moves the routing within 3 steps, so a bias lost on the way would show.
O=(--set model.moe_balance=both --set model.expert_bias_rate=0.05 --set model.shared_expert_ffn=32)
R="$W/bias_e2_e1"
if run 1,1,1,1 "${O[@]}" --set run.dir="$W/bias_ref" > "$W/log" 2>&1 &&
   run d=2,e=2 "${O[@]}" --set run.dir="$R" --set train.max_steps=3 > "$W/log" 2>&1 &&
   run 1,1,1,1 "${O[@]}" --set run.dir="$R" --resume > "$W/log2" 2>&1; then
  losses "$W/bias_ref" > "$W/bias_ref.txt"
  losses "$R" > "$W/got.txt"
  if grep -q "resumed from .*step_000003 at step 3" "$W/log2" && [ "$(wc -l < "$W/got.txt")" -eq 6 ] &&
     close "$W/bias_ref.txt" "$W/got.txt" && ! cmp -s "$W/ref.txt" "$W/bias_ref.txt"; then
    echo "ok   expert bias and shared expert saved on d=2,e=2, resumed on one rank: 6 losses match"
  else
    echo "FAIL expert bias and shared expert saved on d=2,e=2, resumed on one rank"
    cat "$W/log2"; paste "$W/bias_ref.txt" "$W/got.txt"; fails=$((fails + 1))
  fi
else
  echo "FAIL expert bias and shared expert: a run failed"; cat "$W/log" "$W/log2"; fails=$((fails + 1))
fi
# Bad folds, refused before training, naming the numbers.
if "${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --grid d=2,e=4 --set run.dir="$W/bad" > "$W/log" 2>&1 ||
   ! grep -q "E = 4 must divide" "$W/log"; then
  echo "FAIL d=2,e=4 was not refused naming E"; cat "$W/log"; fails=$((fails + 1))
else
  echo "ok   d=2,e=4 refused: $(grep -o 'E = 4 must divide[^(]*' "$W/log" | head -1)"
fi
if "${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --grid d=2 --set parallel.expert_parallel=2 \
     --set model.n_experts=3 --set run.dir="$W/bad3" > "$W/log" 2>&1 ||
   ! grep -q "model.n_experts (3) is not divisible by E = 2" "$W/log"; then
  echo "FAIL 3 experts over E = 2 were not refused by name"; cat "$W/log"; fails=$((fails + 1))
else
  echo "ok   3 experts over E = 2 refused"
fi
echo "$fails failed"
[ $fails -eq 0 ]
