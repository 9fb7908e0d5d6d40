#!/usr/bin/env bash
# Makes the PyTorch anchor's venv (docs/benchmarks.md): a current PyTorch 2.x from PyPI in
# .venv-pytorch at the repository root (not the system Python, not the user's). The PyPI wheel
# pulls CUDA libraries (about 3 GB) and runs on the CPU. `tetrad bench` finds the venv there.
# TORCH_VERSION overrides the version (default: the one benchmarks.md quotes).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${TORCH_VERSION:-2.15.0}"
if ! python3 -m venv --help >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi
[ -x .venv-pytorch/bin/python ] || python3 -m venv .venv-pytorch
.venv-pytorch/bin/python -m pip install -q "torch==${VERSION}"
.venv-pytorch/bin/python -c 'import torch; print("PyTorch", torch.__version__, "in .venv-pytorch")'
