#!/usr/bin/env bash
# Issue 9's memory benchmark: per-rank peak resident memory of the training steps for the small
# configuration under every ZeRO stage and activation-recomputation mode, against the formula of
# docs/parallel.md ("Memory per rank"). One process per case, so nothing carries over.
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
printf "%-5s %-10s %12s %12s %12s %12s %8s\n" zero recompute "peak MiB" "formula MiB" "state MiB" "act MiB" ratio
for zero in 0 1 2; do
  for rc in none selective full; do
    tmp=$(mktemp)
    mpirun -n "$N" --oversubscribe ./build/tetrad bench --grids --configs "$CONFIG" --grid "$GRID" \
      --zero "$zero" --recompute "$rc" --threads 1 --steps 1 --warmup 0 --json "$tmp" > /dev/null
    cat "$tmp" >> "$OUT"
    python3 - "$tmp" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).readline())
print(f"{j['zero']:<5} {j['recompute']:<10} {j['peak_mb']:12.1f} {j['formula_mb']:12.1f} "
      f"{j['formula_state_mb']:12.1f} {j['activation_mb']:12.1f} {j['peak_vs_formula']:8.3f}")
PY
    rm -f "$tmp"
  done
done
