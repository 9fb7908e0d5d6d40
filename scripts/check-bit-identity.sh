#!/usr/bin/env bash
# Behaviour unchanged: runs two tetrad binaries (BEFORE, AFTER) on the same data and configs and
# requires the loss and gradient norm of every step to be bit-identical (the printed JSON numbers,
# 17 significant digits, compared as text). Used to land restructurings (issue 27): build the
# commit before the change and the one after, then
#
#   bash scripts/check-bit-identity.sh BEFORE/tetrad AFTER/tetrad [--quick]
#
# Cases (20 steps each, tiny models, one OpenMP thread per rank): 1x1x1x1 fp32 and bf16; every
# 2-rank grid (X, Y, Z, D, and a 2-stage pipeline) in fp32 and bf16; 2x1x2x1 (Llama) and 1x1x2x2
# with ZeRO 1 and 2; a 2-stage pipeline with the interleaved schedule; recompute full and
# selective; a run of 10 steps on 2x1x1x1 resumed for 10 more on 1x1x2x1 (resume across grids).
# --quick runs a subset (one of each kind). Prints one line per case and a summary; exit 1 on any
# difference, naming the case and the first step that differs.
set -uo pipefail
BEFORE=$(readlink -f "${1:?usage: check-bit-identity.sh BEFORE AFTER [--quick]}")
AFTER=$(readlink -f "${2:?usage: check-bit-identity.sh BEFORE AFTER [--quick]}")
QUICK=0; [ "${3:-}" = --quick ] && QUICK=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$(mktemp -d /tmp/tetrad_bitid.XXXXXX)
trap 'rm -rf "$W"' EXIT
for i in $(seq 1 400); do
  echo "the king went up to the city $i, and the people followed him into the house of the lord."
  [ $((i % 7)) -eq 0 ] && echo
done > "$W/c.txt"
"$BEFORE" prepare --input "$W/c.txt" --out "$W/data" --vocab-size 300 > "$W/prepare.log" 2>&1 ||
  { cat "$W/prepare.log"; echo "prepare failed"; exit 1; }

fail=0; n=0
# The "step loss grad_norm" of each step of run folder $1 (the last line written for a step).
series() { python3 - "$1/metrics.jsonl" <<'EOF'
import json, sys, re
last = {}
for line in open(sys.argv[1]):
    if '"loss"' not in line or '"grad_norm"' not in line: continue
    d = json.loads(line)
    # the numbers as printed: compare the text of each field, not a float parsed from it
    g = lambda k: re.search(r'"%s":([^,}]*)' % k, line).group(1)
    last[d["step"]] = (g("loss"), g("grad_norm"))
for s in sorted(last): print(s, *last[s])
EOF
}
# run_case NAME RANKS GRID [--set k=v ...]: train 20 steps with each binary, compare.
run_case() {
  local name=$1 ranks=$2 grid=$3; shift 3
  local b
  for b in before after; do
    local bin=$BEFORE; [ $b = after ] && bin=$AFTER
    local dir="$W/$name.$b"
    local cmd=("$bin" train --config "$W/base.toml" --grid "$grid" --set run.dir="$dir" "$@")
    if [ "$ranks" -gt 1 ]; then cmd=("${MPIRUN[@]}" -n "$ranks" "${cmd[@]}"); fi
    if ! "${cmd[@]}" > "$dir.log" 2>&1; then
      echo "FAIL $name: $b binary failed (log below)"; tail -n 15 "$dir.log"; fail=1; return
    fi
  done
  compare "$name" "$W/$name.before" "$W/$name.after"
}
compare() {
  local name=$1 a b
  n=$((n + 1))
  a=$(series "$2"); b=$(series "$3")
  if [ -z "$a" ]; then echo "FAIL $name: no steps in $2/metrics.jsonl"; fail=1; return; fi
  if [ "$a" = "$b" ]; then
    echo "ok   $name: $(echo "$a" | wc -l) steps identical (last: $(echo "$a" | tail -n 1))"
  else
    echo "FAIL $name: first difference (step loss grad_norm, before | after):"
    diff <(echo "$a") <(echo "$b") | head -n 4; fail=1
  fi
}
cat > "$W/base.toml" <<EOF
[model]
name = "tiny"
n_layer = 4
[data]
dir = "$W/data"
[train]
micro_batch = 4
seq_len = 32
grad_accum = 2
max_steps = 20
lr = 3e-3
warmup_steps = 5
eval_interval = 0
log_interval = 1
checkpoint_interval = 0
EOF
L=(--set model.family=llama --set model.name=llama-tiny --set model.n_layer=4)
run_case serial.fp32 1 1,1,1,1 --set train.precision=fp32
run_case serial.bf16 1 1,1,1,1 --set train.precision=bf16
run_case x2.fp32 2 2,1,1,1 --set train.precision=fp32
run_case d2.bf16 2 1,1,1,2 --set train.precision=bf16
run_case z2x2.llama.zero1 4 2,1,2,1 --set parallel.zero=1 "${L[@]}"
run_case pipe.interleaved 2 1,1,1,2,1 --set parallel.schedule=interleaved --set parallel.virtual_stages=2
run_case serial.recompute_full 1 1,1,1,1 --set train.recompute=full
if [ $QUICK = 0 ]; then
  for g in 1,2,1,1 1,1,2,1 1,1,1,2 1,1,1,2,1; do
    run_case "g$g.fp32" 2 "$g" --set train.precision=fp32
  done
  for g in 2,1,1,1 1,2,1,1 1,1,2,1 1,1,1,2,1; do
    run_case "g$g.bf16" 2 "$g" --set train.precision=bf16
  done
  run_case y2.llama.fp32 2 1,2,1,1 "${L[@]}" --set train.precision=fp32
  run_case z2.llama.bf16 2 1,1,2,1 "${L[@]}" --set train.precision=bf16
  run_case z2x2.llama.zero2 4 2,1,2,1 --set parallel.zero=2 "${L[@]}"
  run_case z2d2.zero1 4 1,1,2,2 --set parallel.zero=1
  run_case z2d2.zero2.bf16 4 1,1,2,2 --set parallel.zero=2 --set train.precision=bf16
  run_case x2.recompute_full.bf16 2 2,1,1,1 --set train.recompute=full --set train.precision=bf16
  run_case d2.recompute_selective 2 1,1,1,2 --set train.recompute=selective
fi
# Resume across grids: 10 steps on 2x1x1x1 with a checkpoint, then 10 more on 1x1x2x1.
for b in before after; do
  bin=$BEFORE; [ $b = after ] && bin=$AFTER
  dir="$W/resume.$b"
  "${MPIRUN[@]}" -n 2 "$bin" train --config "$W/base.toml" --grid 2,1,1,1 --set run.dir="$dir" \
    --set train.max_steps=10 --set train.checkpoint_interval=10 > "$dir.1.log" 2>&1 ||
    { echo "FAIL resume: first half ($b)"; tail -n 15 "$dir.1.log"; fail=1; }
  "${MPIRUN[@]}" -n 2 "$bin" train --config "$W/base.toml" --grid 1,1,2,1 --set run.dir="$dir" \
    --set train.max_steps=20 --resume > "$dir.2.log" 2>&1 ||
    { echo "FAIL resume: second half ($b)"; tail -n 15 "$dir.2.log"; fail=1; }
done
compare resume.2x1x1x1-to-1x1x2x1 "$W/resume.before" "$W/resume.after"
echo "bit-identity: $n cases, $([ $fail = 0 ] && echo 'all identical' || echo 'DIFFERENCES (above)')"
exit $fail
