#!/usr/bin/env bash
# The parallel benchmark of the 4D-parallelism issue: the same global batch on 1 rank x N threads
# and on every grid of N ranks x 1 thread, side by side. Usage: bench/parallel.sh [N] [CONFIGS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}
CONFIGS=${2:-small}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "### 1 rank x $N threads"
OMP_NUM_THREADS=$N ./build/tetrad bench --configs "$CONFIGS" --threads "$N" --anchor none --steps 3 --warmup 1
echo
echo "### $N ranks x 1 thread, every grid"
OMP_NUM_THREADS=1 mpirun -n "$N" --bind-to core ./build/tetrad bench --grids --configs "$CONFIGS" --threads 1 --steps 3 --warmup 1
