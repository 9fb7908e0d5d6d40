#!/usr/bin/env bash
# Issue 9's memory benchmark: per-rank peak resident memory of the training steps for the small
# configuration under every ZeRO stage and activation-recomputation mode, against the formula of
# docs/parallel.md ("Memory per rank"). One process per case, so nothing carries over.
# Columns (largest rank each): the process baseline (resident before the model existed: program,
# libraries, MPI), the peak of the training step above it, the formula (training state and
# activations, which it counts above the baseline), their ratio, and the resident peak in total
# against formula + baseline. Overlap off (every collective blocking): the figures the docs quote.
# Usage: bench/memory.sh [RANKS] [GRID] [CONFIG] [OUT.jsonl]   (defaults: 2 1,1,1,2 small)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}
GRID=${2:-1,1,1,$N}
CONFIG=${3:-small}
OUT=${4:-bench-memory.jsonl}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
: > "$OUT"
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); $N ranks, grid $GRID, $CONFIG"
printf "%-5s %-10s %9s %9s %9s %9s %9s %7s %9s %7s\n" zero recompute "base MiB" "peak MiB" \
  "formula" "state" "act" ratio "total MiB" "ratio2"
for zero in 0 1 2; do
  for rc in none selective full; do
    tmp=$(mktemp)
    mpirun -n "$N" --oversubscribe ./build/tetrad bench --grids --configs "$CONFIG" --grid "$GRID" \
      --zero "$zero" --recompute "$rc" --overlap off --threads 1 --steps 1 --warmup 0 \
      --json "$tmp" > /dev/null
    cat "$tmp" >> "$OUT"
    python3 - "$tmp" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).readline())
print(f"{j['zero']:<5} {j['recompute']:<10} {j['baseline_mb']:9.1f} {j['peak_mb']:9.1f} "
      f"{j['formula_mb']:9.1f} {j['formula_state_mb']:9.1f} {j['activation_mb']:9.1f} "
      f"{j['peak_vs_formula']:7.3f} {j['peak_total_mb']:9.1f} "
      f"{j['peak_total_vs_formula_plus_baseline']:7.3f}")
PY
    rm -f "$tmp"
  done
done
