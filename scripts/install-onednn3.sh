#!/usr/bin/env bash
# Installs oneDNN 3.x from PyPI (onednn-cpu-gomp + onednn-devel-cpu-gomp: CPU only, GNU OpenMP,
# only system libraries needed) into third_party/onednn of this repository, for a build with
#   cmake -S . -B build -DTETRAD_ONEDNN_ROOT=third_party/onednn
# Not the default build: the measurements in docs/precision.md decide which oneDNN tetrad uses.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${ONEDNN_VERSION:-2023.2.0}"
if ! python3 -m venv --help >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi
# pip installs the packages' data files (lib/, include/) under the venv's prefix.
[ -x third_party/onednn/bin/python ] || python3 -m venv third_party/onednn
third_party/onednn/bin/python -m pip install -q "onednn-cpu-gomp==${VERSION}" "onednn-devel-cpu-gomp==${VERSION}"
test -f third_party/onednn/lib/cmake/dnnl/dnnl-config.cmake
echo "oneDNN ${VERSION} in third_party/onednn: cmake -DTETRAD_ONEDNN_ROOT=third_party/onednn"
