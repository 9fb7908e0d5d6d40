#!/usr/bin/env bash
# Checks that Hugging Face transformers loads tetrad checkpoints of both families and computes
# the same logits as tetrad. Not part of CTest (it needs PyTorch and transformers):
#   apt-get install python3-torch python3-venv
#   python3 -m venv --system-site-packages /tmp/hfenv && /tmp/hfenv/bin/pip install 'transformers<4.37'
# Usage: scripts/check-hf-parity.sh [PYTHON] (default /tmp/hfenv/bin/python). Needs data/kjv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-/tmp/hfenv/bin/python}
TOKENS="1,50,300,7,99,1000,8000,3,42,42,5"
echo "[$TOKENS]" > /tmp/tetrad_hf_tokens.json
for m in tiny llama-tiny; do
  ./build/tetrad train --set model.name=$m --set model.vocab_size=8192 --set run.dir=runs/hf_$m \
    --set train.max_steps=5 --set train.eval_interval=0 > /dev/null
  ./build/tetrad logits --model runs/hf_$m --tokens "$TOKENS" --out /tmp/tetrad_logits_$m.bin
  ./build/tetrad export --model runs/hf_$m --out runs/hf_$m/hf
  "$PY" scripts/hf_check.py runs/hf_$m/hf \
    /tmp/tetrad_hf_tokens.json /tmp/tetrad_logits_$m.bin
done
