#!/usr/bin/env bash
# "No slower": a before and an after tetrad binary side by side in one run (issue 27's benchmark).
# For each configuration and precision the two binaries run alternately, A B B A (ROUNDS pairs),
# each `tetrad bench` on random tokens with all cores; prints every run's tokens/s, the median of
# each binary and the ratio after/before. The machines are shared: the load average is printed
# before and after, and only ratios inside one run are compared.
#   bench/before_after.sh BEFORE AFTER [CONFIGS=small,gpt2-124m] [PRECISIONS=fp32,bf16] [STEPS=5] [ROUNDS=2]
# With GRID=x,y,z,d (or x,y,z,p,d) in the environment each run is that grid under mpirun instead,
# one rank per grid point x 1 thread bound to a core (`tetrad bench --grids --grid GRID --overlap
# on`: the parallel.* defaults), e.g. GRID=2,1,1,1 for the X axis against the same grid before.
set -euo pipefail
BEFORE=$(readlink -f "$1"); AFTER=$(readlink -f "$2")
CONFIGS=${3:-small,gpt2-124m}; PRECS=${4:-fp32,bf16}; STEPS=${5:-5}; ROUNDS=${6:-2}
W=$(mktemp -d /tmp/tetrad_before_after.XXXXXX); trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores; $(lscpu | grep -o -E 'amx_bf16|avx512_bf16' | sort -u | tr '\n' ' '))"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${GRID:-}" ]; then
  RANKS=$(python3 -c 'import sys, math; print(math.prod(int(v) for v in sys.argv[1].split(",")))' "$GRID")
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  echo "grid $GRID: $RANKS ranks x 1 thread"
fi
tok() { python3 -c 'import json,sys; print("%.1f" % json.loads(open(sys.argv[1]).read().splitlines()[-1])["tokens_per_s"])' "$1"; }
for cfg in ${CONFIGS//,/ }; do
  for prec in ${PRECS//,/ }; do
    a=(); b=()
    for r in $(seq 1 "$ROUNDS"); do
      for which in A B B A; do
        bin=$BEFORE; [ $which = B ] && bin=$AFTER
        rm -f "$W/j"
        if [ -n "${GRID:-}" ]; then
          OMP_NUM_THREADS=1 mpirun -n "$RANKS" --bind-to core "$bin" bench --grids --grid "$GRID" \
            --configs "$cfg" --precision "$prec" --threads 1 --steps "$STEPS" --warmup 2 \
            --overlap on --json "$W/j" > "$W/log" 2>&1 || { echo "FAIL $which $cfg $prec"; tail -5 "$W/log"; exit 1; }
        else
          "$bin" bench --configs "$cfg" --precision "$prec" --steps "$STEPS" --warmup 2 --anchor none \
            --json "$W/j" > "$W/log" 2>&1 || { echo "FAIL $which $cfg $prec"; tail -5 "$W/log"; exit 1; }
        fi
        t=$(tok "$W/j")
        if [ $which = A ]; then a+=("$t"); else b+=("$t"); fi
      done
    done
    python3 - "$cfg" "$prec" "${a[*]}" "${b[*]}" <<'PY'
import sys, statistics as st
cfg, prec, a, b = sys.argv[1], sys.argv[2], list(map(float, sys.argv[3].split())), list(map(float, sys.argv[4].split()))
ma, mb = st.median(a), st.median(b)
print(f"{cfg:10s} {prec}: before {a} median {ma:.1f} | after {b} median {mb:.1f} tokens/s | ratio {mb/ma:.3f}")
PY
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
