#!/usr/bin/env bash
# Configures and builds tetrad (Release) into build/: the targets named as arguments (e.g.
# `scripts/build.sh tetrad`, what the main job needs), everything (the tests too) without any.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j"$(nproc)" "${targets[@]}" 2>&1 | tail -n 3
