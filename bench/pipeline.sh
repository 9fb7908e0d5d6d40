#!/usr/bin/env bash
# Issue 9's pipeline benchmark: the measured bubble (each rank's time waiting for its neighbours
# over its compute time, mean over ranks) of the small configuration on GP stages, against the
# textbook (p - 1) / (v m), for several micro-batch counts and both schedules.
# Usage: bench/pipeline.sh [GP] [LAYERS] [MICRO-BATCH COUNTS]   (defaults: 2 12 "2 4 8")
# SPLIT=balanced (or even, the default, or counts per virtual stage such as SPLIT=7,5; with
# interleaving the counts must number 2 x GP) chooses parallel.pipeline_layers; each line prints
# the split it ran.
# One rank per stage, one thread each: run on at least GP free cores (never oversubscribed).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:-2}
LAYERS=${2:-12}
MS=${3:-"2 4 8"}
SPLIT=${SPLIT:-even}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); $P stages, small with $LAYERS layers, split $SPLIT"
for m in $MS; do
  for sched in "1f1b 1" "interleaved 2"; do
    set -- $sched
    [ $((m % P)) -ne 0 ] && [ "$1" = interleaved ] && continue
    mpirun -n "$P" --bind-to core ./build/tetrad bench --grids --configs small --layers "$LAYERS" \
      --grid "1,1,1,$P,1" --micro-batches "$m" --schedule "$1" --virtual-stages "$2" \
      --pipeline-layers "$SPLIT" --threads 1 --steps 2 --warmup 1 | grep -E "pipeline |skipped"
  done
done
