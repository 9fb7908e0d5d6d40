#!/usr/bin/env bash
# Checkpoints reshard over the expert fold E (docs/moe.md, "Expert parallelism"): a mixture of
# experts (mixtral-tiny, dropless, aux and z losses) saved after 3 steps with its experts split
# over E = 2 resumes at E = 1 (one rank, and two data ranks) and at E = 4 (four ranks), saved at
# E = 4 resumes at E = 2, saved at E = 1 resumes at E = 2 (set by parallel.expert_parallel),
# saved with the experts also split over X (x=2,d=2,e=2) resumes on one rank:
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
