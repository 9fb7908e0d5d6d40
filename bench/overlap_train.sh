#!/usr/bin/env bash
# Overlap off vs on through `tetrad train` (the trainer's own breakdown, metrics.jsonl of rank 0):
# 2 ranks x 1 thread, one grid, the given modes run in turn ROUNDS times (alternating, so load
# drifts hit every mode alike). Prints per run the mean over the steps after the first of the
# step time, compute, wait (for the slowest rank), exposed and issued communication and the hidden
# share, and the last loss
# (modes that keep results bit-identical must print the same loss).
#
#   [SEQ=512] bench/overlap_train.sh TETRAD [GRID=1,1,2,1] [MODEL=small] [STEPS=4] [ROUNDS=3] [MODES="off thread poll"]
#
# Modes: off = every collective blocking; thread / poll = backward all-reduce, reduce-scatter,
# prefetch depth 1 (and across steps, during the optimizer) and data-parallel bucket overlap on,
# progress by the helper thread / by polling; instep = thread without the prefetch across steps;
# defaults = the configuration's defaults. Timings on a shared machine are noisy: compare modes
# side by side only.
set -euo pipefail
T=$(readlink -f "$1"); GRID=${2:-1,1,2,1}; MODEL=${3:-small}; STEPS=${4:-4}; ROUNDS=${5:-3}; SEQ=${SEQ:-512}
MODES=${6:-off thread poll}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for i in $(seq 1 3000); do echo "the king went up to the city $i, and the people followed him to the river."; [ $((i % 5)) -eq 0 ] && echo; done > "$W/c.txt"
"$T" prepare --input "$W/c.txt" --out "$W/data" --vocab-size 300 > /dev/null
ALL=(--set parallel.overlap_backward_allreduce=true --set parallel.overlap_reduce_scatter=true
     --set parallel.prefetch_depth=1 --set parallel.overlap_dp_allreduce=true
     --set parallel.prefetch_across_steps=true)
NONE=(--set parallel.overlap_backward_allreduce=false --set parallel.overlap_reduce_scatter=false
      --set parallel.prefetch_depth=0 --set parallel.overlap_dp_allreduce=false
      --set parallel.prefetch_across_steps=false
      --set parallel.progress_thread=false)
printf "%-6s %-9s %-7s %8s %9s %8s %10s %9s %7s %s\n" round mode grid "step s" "compute s" "wait s" "exposed s" "issued s" hidden "last loss"
for r in $(seq 1 "$ROUNDS"); do
  for m in $MODES; do
    case $m in
      off) O=("${NONE[@]}") ;;
      thread) O=("${ALL[@]}" --set parallel.progress_thread=true) ;;
      poll) O=("${ALL[@]}" --set parallel.progress_thread=false) ;;
      instep) O=("${ALL[@]}" --set parallel.progress_thread=true --set parallel.prefetch_across_steps=false) ;;
      defaults) O=() ;;
      *) echo "unknown mode $m" >&2; exit 1 ;;
    esac
    rm -rf "$W/run"
    mpirun --oversubscribe -n 2 "$T" train --set model.name="$MODEL" --set data.dir="$W/data" \
      --set run.dir="$W/run" --set train.micro_batch=4 --set train.seq_len="$SEQ" \
      --set train.max_steps="$STEPS" --set train.eval_interval=0 --set train.log_interval=1000 \
      --set train.threads=1 --grid "$GRID" "${O[@]}" > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
    python3 - "$W/run/metrics.jsonl" "$r" "$m" "$GRID" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
timed = rows[1:] or rows
mean = lambda k: sum(x[k] for x in timed) / len(timed)
issued = mean("t_comm_issued_s")
hidden = 1 - mean("t_comm_exposed_s") / issued if issued > 0 else 0
print(f"{sys.argv[2]:<6} {sys.argv[3]:<9} {sys.argv[4]:<7} {mean('step_time_s'):8.3f} "
      f"{mean('t_compute_s'):9.3f} {mean('t_wait_s'):8.3f} {mean('t_comm_exposed_s'):10.3f} "
      f"{issued:9.3f} {100 * hidden:6.0f}% {rows[-1]['loss']!r}")
PY
  done
done
