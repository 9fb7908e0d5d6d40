#!/usr/bin/env bash
# `tetrad train --grid auto` chooses the expert fold E and trains it (issue 32; docs/planner.md,
# "Mixture of experts"): mixtral-tiny (4 experts, top 2, 4 x 32 tokens, fp32) on 2 ranks of the
# shipped local machine. The planner's first choice is d=2,e=2, said why, trained 3 steps,
# on the expert groups of that fold, with the same losses bit for bit as --grid d=2,e=2; the trainer's
# memory line (the formula, experts per rank over E and the exchange's scratch) is the plan's
# memory/rank for that grid; `tetrad plan` lists the row as trainable, and `--why d=2,e=2` gives
# the command that trains it and prices its all-to-alls exposed (the trainer does not overlap
# them yet).
source "$(dirname "${BASH_SOURCE[0]}")/../cli_common.sh" "$1"
S=(--set model.name=mixtral-tiny --set data.dir="$W/data" --set train.seq_len=32
   --set train.max_steps=3 --set train.eval_interval=0 --set train.micro_batch=4
   --set train.precision=fp32 --set train.attention_precision=fp32 --set train.gemm_layouts=rule
   --set parallel.machine=local)
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; shift; [ $# -gt 0 ] && cat "$@"; fails=$((fails + 1)); }

"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/auto" --grid auto > "$W/log_auto" 2>&1 ||
  bad "--grid auto on 2 ranks did not train" "$W/log_auto"
if grep -q "^grid auto: d=2,e=2 (x,y,z,p,d = 1x1x1x1x2 e2), the planner's first choice" "$W/log_auto" &&
   [ "$(losses "$W/auto" | wc -l)" -eq 3 ] &&
   [ "$(grep -c "^rank [01] = .* of d2\.e2: .* e \[0,1\] ed \[[01]\]; " "$W/log_auto")" -eq 2 ]; then
  ok "--grid auto chose d=2,e=2, said why, built its expert groups and trained 3 steps"
else
  bad "--grid auto: expected d=2,e=2 chosen and trained" "$W/log_auto"
fi

# The formula is the model's own count: state + activations + the expert exchange's bound on the
# per-rank line.
st=$(sed -n 's/^rank 0 = .*; memory: state \([0-9.]*\) MiB .*/\1/p' "$W/log_auto" | head -1)
ac=$(sed -n 's/^rank 0 = .*; memory: state .*), activations \([0-9.]*\) MiB (train.recompute.*/\1/p' "$W/log_auto" | head -1)
ex=$(sed -n 's/^rank 0 = .*, expert exchange up to \([0-9.]*\) MiB (dropless worst case)$/\1/p' "$W/log_auto" | head -1)
formula=$(sed -n 's/^memory: formula \([0-9.]*\) MiB of .*/\1/p' "$W/log_auto" | head -1)
if [ -n "$st" ] && [ -n "$ac" ] && [ -n "$ex" ] && [ -n "$formula" ] &&
   awk -v f="$formula" -v s="$st" -v a="$ac" -v e="$ex" 'BEGIN { d = f - s - a - e; exit !(e > 0 && d < 0.06 && d > -0.06) }'; then
  ok "the trainer's formula $formula MiB = the model's state $st + activations $ac + expert exchange $ex MiB"
else
  bad "formula '$formula' MiB against state '$st' + activations '$ac' + expert exchange '$ex' MiB" "$W/log_auto"
fi

# The plan's memory/rank (MB, one decimal) is the trainer's formula (MiB) for that grid.
plan_mb=$(sed -n 's/.*memory\/rank \([0-9.]*\) MB$/\1/p' "$W/log_auto" | head -1)
if [ -n "$plan_mb" ] && [ -n "$formula" ] &&
   awk -v p="$plan_mb" -v f="$formula" 'BEGIN { d = p * 1e6 - f * 1048576; exit !(d < 60000 && d > -60000) }'; then
  ok "the trainer's formula $formula MiB is the plan's memory/rank $plan_mb MB"
else
  bad "the trainer's formula '$formula' MiB against the plan's '$plan_mb' MB" "$W/log_auto"
fi

"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/named" --grid d=2,e=2 > "$W/log_named" 2>&1 ||
  bad "--grid d=2,e=2 did not train" "$W/log_named"
if [ "$(losses "$W/named" | wc -l)" -eq 3 ] && cmp -s <(losses "$W/auto") <(losses "$W/named"); then
  ok "--grid auto trains as --grid d=2,e=2 (the same losses)"
else
  bad "--grid auto against --grid d=2,e=2"; paste <(losses "$W/auto") <(losses "$W/named")
fi

P=(--model mixtral-tiny --machine local --ranks 2 --micro-batch 4 --global-batch 4 --seq 32 --precision fp32)
out=$("$TETRAD" plan "${P[@]}" 2>&1)
if grep -q "^ *1  1x1x1x1x2 e2 " <<<"$out" && ! grep -q "not trainable" <<<"$out"; then
  ok "tetrad plan: 1x1x1x1x2 e2 first, no row marked not trainable"
else
  bad "tetrad plan: $out"
fi
out=$("$TETRAD" plan "${P[@]}" --why d=2,e=2 2>&1)
row=$(grep "all-to-all of expert dispatch/combine" <<<"$out")
if grep -q "^grid 1x1x1x1x2 e2 .*: valid" <<<"$out" && grep -q "^train it with: tetrad train --grid d=2,e=2$" <<<"$out" &&
   [ -n "$row" ] &&
   awk '{ if ($(NF) != $(NF - 2) || $(NF - 1) != $(NF - 3)) exit 1 }' <<<"$row"; then
  ok "tetrad plan --why d=2,e=2: the command that trains it, the dispatch/combine all-to-all fully exposed ($(echo $row | awk '{ print $(NF - 1) $NF }'))"
else
  bad "tetrad plan --why d=2,e=2: $out"
fi
[ $fails -eq 0 ] && echo "all --grid auto expert-fold checks passed"
exit $fails
