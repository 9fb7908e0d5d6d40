#!/usr/bin/env bash
# `tetrad train --device`: the trainer on "cpu-strict" (the CPU's arithmetic on device memory the
# host cannot read: backend/cpu/strict_backend.hpp) gives losses bit-identical to --device cpu,
# serially and on 2 ranks (ZeRO 1 too, whose checkpoints are streamed), with sharded checkpoints
# written from and resumed into device memory (resumed run bit-identical to the uninterrupted
# one), and an HF export of the device run that loads back; --device cuda where this build or
# machine cannot run it, and a misspelt device, are refused with a clear message.
source "$(dirname "${BASH_SOURCE[0]}")/cli_common.sh" "$1"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
N=12
# train.gemm_layouts = rule: cpu and cpu-strict runs are separate processes, which tune would time
# separately (possibly another plan: the same sums in another order).
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=$N
   --set train.eval_interval=0 --set train.log_interval=100000 --set train.checkpoint_interval=4
   --set train.keep_checkpoints=5 --set train.gemm_layouts=rule)

for mode in serial mpi mpi_zero1; do
  case $mode in
    serial) G=(--grid 1,1,1,1); L=() ;;
    mpi) G=(--grid 2,1,1,1); L=("${MPIRUN[@]}" -n 2) ;;
    mpi_zero1) G=(--grid 1,1,1,2 --set parallel.zero=1); L=("${MPIRUN[@]}" -n 2) ;;
  esac
  "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --device cpu --set run.dir="$W/cpu_$mode" > "$W/log" 2>&1 || { cat "$W/log"; bad "$mode: cpu run"; continue; }
  "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --device cpu-strict --set run.dir="$W/dev_$mode" > "$W/log" 2>&1 || { cat "$W/log"; bad "$mode: cpu-strict run"; continue; }
  if grep -q "device: cpu-strict" "$W/log" && cmp -s <(losses "$W/cpu_$mode") <(losses "$W/dev_$mode") &&
     [ "$(losses "$W/dev_$mode" | wc -l)" -eq $N ]; then
    ok "$mode: $N losses on cpu-strict bit-identical to cpu"
  else
    bad "$mode: cpu-strict losses differ from cpu"; diff <(losses "$W/cpu_$mode") <(losses "$W/dev_$mode") | head
  fi
  # Resume from the step-8 checkpoint (written from device memory) into a fresh device run.
  rm -rf "$W/dev_$mode/checkpoints/step_000012"
  sed -i 's/step_000012/step_000008/' "$W/dev_$mode/checkpoints/latest" 2>/dev/null
  "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --device cpu-strict --set run.dir="$W/dev_$mode" --resume > "$W/log" 2>&1 || { cat "$W/log"; bad "$mode: resume on cpu-strict"; continue; }
  if grep -q "resumed from .*step_000008 at step 8" "$W/log" && cmp -s <(losses "$W/cpu_$mode") <(losses "$W/dev_$mode"); then
    ok "$mode: resumed on cpu-strict from step 8: losses bit-identical to the uninterrupted run"
  else
    bad "$mode: resume on cpu-strict"; grep -i "resum" "$W/log" | head -3; diff <(losses "$W/cpu_$mode") <(losses "$W/dev_$mode") | head
  fi
done

# Export the device run's last checkpoint and import it back: same weights (logits of the CPU
# run's and the device run's exports are the same file contents).
if "$TETRAD" export --model "$W/dev_serial" --out "$W/hf_dev" > "$W/log" 2>&1 &&
   "$TETRAD" export --model "$W/cpu_serial" --out "$W/hf_cpu" > /dev/null 2>&1 &&
   cmp -s "$W/hf_dev/model.safetensors" "$W/hf_cpu/model.safetensors"; then
  ok "export of the cpu-strict run equals the cpu run's, byte for byte"
else
  bad "export of the cpu-strict run"; cat "$W/log" | tail -3
fi

# Refusals, before any step: a device this build or machine cannot run, and a misspelt one.
out=$("$TETRAD" train "${S[@]}" --device cuda --set run.dir="$W/cuda" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -Eq 'backend "cuda" cannot run here|unknown backend "cuda"' <<<"$out" && [ ! -e "$W/cuda/metrics.jsonl" ]; then
  ok "--device cuda refused: $(grep -Eo 'backend "cuda".*|unknown backend.*' <<<"$out" | head -1 | cut -c1-150)"
else
  bad "--device cuda (status $rc): $out"
fi
out=$("$TETRAD" train "${S[@]}" --device gpu --set run.dir="$W/gpu" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'train.device: expected "cpu", "cpu-strict", "cuda" or "cuda:N", got "gpu"' <<<"$out"; then
  ok "--device gpu refused naming the choices"
else
  bad "--device gpu (status $rc): $out"
fi
[ $fails -eq 0 ] && echo "all device CLI checks passed"
exit $fails
