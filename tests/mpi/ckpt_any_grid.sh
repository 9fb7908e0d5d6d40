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
# Activations in fp32 (train.activation_precision) for the same reason: bf16 runs store the
# block's tensors in bf16 (docs/precision.md, "bf16 through the step in the parallel model"), where a grid's 1-ulp fp32
# differences flip roundings (resuming 1,1,1,2 on 2,2,1,1 measured 1.1e-5 relative at step 6).
# train.gemm_layouts = rule: the uninterrupted and the stopped runs are separate processes, which
# tune would time separately (possibly another plan: the same sums in another order).
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=6
   --set train.eval_interval=0 --set train.micro_batch=4 --set train.attention_precision=fp32
   --set train.activation_precision=fp32 --set train.gemm_layouts=rule)
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_resume_common.sh"
GRIDS=(1,1,1,1 2,1,1,1 1,2,1,1 1,1,2,1 1,1,1,2 4,1,1,1 1,4,1,1 1,1,4,1 1,1,1,4 2,2,1,1 2,1,2,1
       2,1,1,2 1,2,2,1 1,2,1,2 1,1,2,2)
for i in "${!GRIDS[@]}"; do
  resumes "${GRIDS[$i]}" "${GRIDS[$(( (i + 5) % ${#GRIDS[@]} ))]}"
done
# The context axis (issue 28): saved on a grid with c > 1 the run resumes on one rank and on
# grids without it, and a checkpoint of a grid without it resumes on c = 2; all six losses match
# the one-rank run (the first three trained with each sequence cut into 2c chunks).
for pair in "c=2 1,1,1,1" "c=2,d=2 2,1,1,1" "1,1,1,2 c=2" "c=4 x=2,c=2"; do
  resumes $pair
done
# Same grid: bit-identical to that grid's uninterrupted run.
# (one rank and 1,1,2,1 are checked by tests/ckpt_cli.sh's SIGTERM resume)
resumes_bit_identical 2,1,1,2
echo "$fails failed"
[ $fails -eq 0 ]
