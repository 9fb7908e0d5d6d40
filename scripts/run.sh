#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, prepare the default corpus (the King
# James Bible from Debian's bible-kjv), train the default model with live progress, then sample
# from it. Extra arguments go to `tetrad train` (e.g. --set train.max_steps=200).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh tetrad   # the binary only: the tests are test.sh's
if [ ! -f data/kjv/meta.json ]; then
  mkdir -p data
  bible -f "Gen1:1-Rev22:21" > data/kjv.txt
  ./build/tetrad prepare --input data/kjv.txt --out data/kjv --vocab-size 8192 --val-fraction 0.02
fi
./build/tetrad train --config configs/default.toml "$@"
./build/tetrad generate --model runs/default --prompt "And God said" --max-new 60 --temperature 0.8 --top-k 40
