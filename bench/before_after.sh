#!/usr/bin/env bash
# "No slower": a before and an after tetrad binary side by side in one run (issue 27's benchmark).
# For each configuration and precision the two binaries run alternately, A B B A (ROUNDS pairs),
# each `tetrad bench` on random tokens with all cores; prints every run's tokens/s, the median of
# each binary and the ratio after/before. The machines are shared: the load average is printed
# before and after, and only ratios inside one run are compared.
#   bench/before_after.sh BEFORE AFTER [CONFIGS=small,gpt2-124m] [PRECISIONS=fp32,bf16] [STEPS=5] [ROUNDS=2]
set -euo pipefail
BEFORE=$(readlink -f "$1"); AFTER=$(readlink -f "$2")
CONFIGS=${3:-small,gpt2-124m}; PRECS=${4:-fp32,bf16}; STEPS=${5:-5}; ROUNDS=${6:-2}
W=$(mktemp -d /tmp/tetrad_before_after.XXXXXX); trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores; $(lscpu | grep -o -E 'amx_bf16|avx512_bf16' | sort -u | tr '\n' ' '))"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
tok() { python3 -c 'import json,sys; print("%.1f" % json.loads(open(sys.argv[1]).read().splitlines()[-1])["tokens_per_s"])' "$1"; }
for cfg in ${CONFIGS//,/ }; do
  for prec in ${PRECS//,/ }; do
    a=(); b=()
    for r in $(seq 1 "$ROUNDS"); do
      for which in A B B A; do
        bin=$BEFORE; [ $which = B ] && bin=$AFTER
        rm -f "$W/j"
        "$bin" bench --configs "$cfg" --precision "$prec" --steps "$STEPS" --warmup 2 --anchor none \
          --json "$W/j" > "$W/log" 2>&1 || { echo "FAIL $which $cfg $prec"; tail -5 "$W/log"; exit 1; }
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
