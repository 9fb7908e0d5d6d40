#!/usr/bin/env bash
# Stress for graceful stops: `tetrad train` with every threaded path on (overlap switches, the
# progress thread, async checkpoints every 2 steps, validation every 7, the watchdog), SIGTERM'd
# at a random moment 0.3-4 s after its first step, many times; counts clean stops and crashes.
# This found the heap corruption of issue 7 (oneDNN's JIT GEMM and signal handlers,
# src/tetrad/core/signals.hpp): about 1 run in 40 aborted before the fix.
#
#   scripts/stress_sigterm.sh TETRAD RUNS [serial|mpi|both] [GRID for mpi, default 1,1,2,1]
#
# Cores of crashed runs are kept in $STRESS_DIR/cores (default /tmp/tetrad-stress) with the log.
set -u
T=$(readlink -f "$1"); N=$2; MODE=${3:-both}; GRID=${4:-1,1,2,1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${STRESS_DIR:-/tmp/tetrad-stress}
mkdir -p "$OUT/cores"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1
ulimit -c unlimited
for i in $(seq 1 200); do echo "the king went up to the city $i, and the people followed him."; [ $((i % 5)) -eq 0 ] && echo; done > c.txt
"$T" prepare --input c.txt --out data --vocab-size 300 > /dev/null || exit 1
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=100000
   --set train.eval_interval=7 --set train.eval_batches=2 --set train.log_interval=1
   --set train.checkpoint_interval=2 --set train.keep_checkpoints=2 --set train.async_checkpoint=true
   --set train.step_timeout=120
   --set parallel.overlap_backward_allreduce=true --set parallel.overlap_reduce_scatter=true
   --set parallel.prefetch_depth=1 --set parallel.overlap_dp_allreduce=true
   --set parallel.progress_thread=true)
crash=0; ok=0; other=0
for i in $(seq 1 "$N"); do
  m=$MODE; [ "$MODE" = both ] && { [ $((i % 2)) -eq 0 ] && m=serial || m=mpi; }
  if [ "$m" = serial ]; then G=(--grid 1,1,1,1); L=(); else G=(--grid "$GRID"); L=(mpirun --oversubscribe -n 2); fi
  rm -rf "$W/run" "$W"/core*
  timeout -s KILL 120 "${L[@]}" "$T" train "${S[@]}" "${G[@]}" --set run.dir="$W/run" > "$W/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 400); do grep -q '"loss"' "$W/run/metrics.jsonl" 2>/dev/null && break; sleep 0.05; done
  sleep "$(awk -v s=$RANDOM 'BEGIN { printf "%.3f", 0.3 + (s % 3700) / 1000 }')"
  # The ranks themselves (not timeout or mpirun), as a scheduler signals them.
  ranks=$(for q in $(pgrep -f -- "run.dir=$W/run"); do
            case $(cat /proc/$q/comm 2>/dev/null) in timeout|mpirun|prterun|orterun) ;; *) echo "$q" ;; esac
          done)
  kill -TERM $ranks 2>/dev/null
  wait $pid; rc=$?
  if grep -q -E "corrupted|double free|free\(\)|malloc\(\)|Segmentation|Aborted|signal 6|signal 11" "$W/log"; then
    crash=$((crash + 1)); stamp=$(date +%s)_$i
    cp "$W/log" "$OUT/crash_$stamp.log"
    for c in "$W"/core*; do [ -f "$c" ] && mv "$c" "$OUT/cores/core_$stamp"; done
    echo "run $i ($m): CRASH, status $rc: $(grep -m1 -E 'corrupted|free|Segmentation|Aborted' "$W/log")"
  elif [ $rc -eq 0 ] && grep -q "stopping at step" "$W/log"; then
    ok=$((ok + 1))
  else
    other=$((other + 1)); cp "$W/log" "$OUT/other_$(date +%s)_$i.log"
    echo "run $i ($m): status $rc without a crash marker; log in $OUT"
  fi
done
echo "stress_sigterm: $N runs ($MODE): $ok clean SIGTERM stops, $crash crashes, $other other"
[ $crash -eq 0 ] && [ $other -eq 0 ]
