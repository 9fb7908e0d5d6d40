#!/usr/bin/env bash
# `tetrad bench` of two binaries side by side (issue 17's no-slower check): for each config and
# precision, REPEATS pairs; in each pair the BEFORE and AFTER binaries run AT THE SAME TIME, one
# thread each, so both see the same load from whatever else shares the machine (sequential runs
# on the shared 2-core machine drift by more than the effect being measured). The pairs alternate
# which binary starts first. Prints every pair's tokens/s and after/before ratio, then per cell
# the medians (of tokens/s and of the pair ratios), with the load average before and after each
# cell and the CPU model.
#   bench/side_by_side.sh BEFORE AFTER [CONFIGS=small,gpt2-124m] [PRECISIONS=fp32,bf16] [REPEATS=3]
# STEPS_<config> / WARMUP (environment) set the timed and warm-up steps (default 3 and 1; 2 for
# gpt2-124m). The JSON lines of every run are kept in $OUT (default a temporary folder).
set -euo pipefail
BEFORE="$1"; AFTER="$2"
IFS=, read -r -a CONFIGS <<< "${3:-small,gpt2-124m}"
IFS=, read -r -a PRECS <<< "${4:-fp32,bf16}"
REPEATS="${5:-3}"
WARMUP="${WARMUP:-1}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores; $(grep -o -m1 'amx_bf16' /proc/cpuinfo || echo 'no amx_bf16'))"
echo "before: $BEFORE"
echo "after:  $AFTER"
echo "runs kept in $OUT"
tok() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "tokens_per_s" in l][-1]["tokens_per_s"])' "$1"; }
run() {  # run BIN PREC CONFIG STEPS JSON
  "$1" bench --configs "$3" --precision "$2" --threads 1 --steps "$4" --warmup "$WARMUP" \
    --anchor none --json "$5" > "$5.log" 2>&1
}
for config in "${CONFIGS[@]}"; do
  var="STEPS_${config//-/_}"
  default_steps=3; [ "$config" = gpt2-124m ] && default_steps=2
  steps="${!var:-$default_steps}"
  for prec in "${PRECS[@]}"; do
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    ratios=(); befores=(); afters=()
    for r in $(seq 1 "$REPEATS"); do
      b="$OUT/$config.$prec.$r.before.json"; a="$OUT/$config.$prec.$r.after.json"
      rm -f "$a" "$b"
      if [ $((r % 2)) -eq 1 ]; then
        run "$BEFORE" "$prec" "$config" "$steps" "$b" & pb=$!
        run "$AFTER" "$prec" "$config" "$steps" "$a" & pa=$!
      else
        run "$AFTER" "$prec" "$config" "$steps" "$a" & pa=$!
        run "$BEFORE" "$prec" "$config" "$steps" "$b" & pb=$!
      fi
      wait "$pb" || { echo "before failed:"; cat "$b.log"; exit 1; }
      wait "$pa" || { echo "after failed:"; cat "$a.log"; exit 1; }
      tb=$(tok "$b"); ta=$(tok "$a")
      ratio=$(python3 -c "print(f'{$ta / $tb:.3f}')")
      echo "  $config $prec pair $r: before $tb tok/s, after $ta tok/s, after/before $ratio (load $(cut -d' ' -f1 /proc/loadavg))"
      ratios+=("$ratio"); befores+=("$tb"); afters+=("$ta")
    done
    python3 - "$config" "$prec" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" "${#ratios[@]}" \
      "${ratios[@]}" "${befores[@]}" "${afters[@]}" <<'PY'
import statistics, sys
config, prec, l0, l1, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
v = [float(x) for x in sys.argv[6:]]
ratios, before, after = v[:n], v[n:2 * n], v[2 * n:]
mb, ma = statistics.median(before), statistics.median(after)
print(f"{config} {prec}: median tok/s before {mb:.1f}, after {ma:.1f}, ratio of medians "
      f"{ma / mb:.3f}, median of pair ratios {statistics.median(ratios):.3f} "
      f"(pairs {min(ratios):.3f}..{max(ratios):.3f}); load {l0} -> {l1}")
PY
  done
done
