# Sourced by the shell tests that drive the `tetrad` binary (first argument): strict pipes, one
# OpenMP thread per process, mpirun with the flags a root CI machine needs (machine-notes.md), a
# scratch folder removed on exit, and a small prepared corpus in "$W/data" (200 lines, byte-level
# BPE of 300 tokens), enough for the tiny model's steps.
set -uo pipefail
TETRAD=$1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1
for i in $(seq 1 200); do echo "the king went up to the city $i, and the people followed him."; [ $((i % 5)) -eq 0 ] && echo; done > "$W/c.txt"
"$TETRAD" prepare --input "$W/c.txt" --out "$W/data" --vocab-size 300 > /dev/null || exit 1
# The loss of each step of run folder $1, the last one written for it (a resumed run may redo
# steps), one per line in step order.
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/' |
           awk '{ l[$1] = $2 } END { for (s = 1; s in l; s++) print l[s] }'; }
