#!/usr/bin/env bash
# bf16 benchmark of issue 19, side by side in one run: a "before" and an "after" tetrad binary,
# fp32 and bf16, on one configuration, then the PyTorch anchor (eager and torch.compile, the
# faster reported) once per precision. Prints the load average before and after: the machines
# are shared, so compare ratios inside one run only.
#   bench/bf16.sh BEFORE_BINARY AFTER_BINARY [CONFIG=gpt2-124m] [STEPS=3] [WARMUP=1] [THREADS=2]
# The anchor needs the venv of bench/setup-pytorch.sh (.venv-pytorch); ANCHOR=none skips it.
set -euo pipefail
BEFORE="$1"; AFTER="$2"; CONFIG="${3:-gpt2-124m}"; STEPS="${4:-3}"; WARMUP="${5:-1}"; T="${6:-2}"
cd "$(dirname "$0")/.."
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) | $(lscpu | grep -o 'amx_bf16' | head -1 || true)"
for prec in fp32 bf16; do
  for bin in "$BEFORE" "$AFTER"; do
    echo "=== $bin --precision $prec"
    "$bin" bench --configs "$CONFIG" --precision "$prec" --threads "$T" --steps "$STEPS" \
      --warmup "$WARMUP" --anchor none 2>&1 | grep -E "step time|tokens/s|model FLOP|GEMM ceiling|FLOP-weighted|memory:|by phase|fastest|precision:|gemm layouts"
  done
done
if [ "${ANCHOR:-}" != "none" ] && [ -x .venv-pytorch/bin/python ]; then
  for prec in fp32 bf16; do
    echo "=== PyTorch $prec"
    .venv-pytorch/bin/python bench/pytorch_gpt2.py --config "$CONFIG" --threads "$T" \
      --steps "$STEPS" --warmup "$WARMUP" --precision "$prec" 2>/dev/null |
      python3 -c 'import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(j["torch_version"], j["precision"], {m: round(r.get("tokens_per_s", 0), 1) for m, r in j["modes"].items()}, "best", j["best_mode"], round(j["tokens_per_s"], 1))'
  done
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
