#!/usr/bin/env bash
# Installs what tetrad needs from Debian 12's packages (skips what is already there).
# python3 is for the test scripts only (they check JSON, SVG and binary files with its standard
# library); tetrad itself never runs it. A minimal Debian 12 has no python3.
set -euo pipefail
PKGS=(cmake g++ make pkg-config
      libdnnl-dev ocl-icd-opencl-dev opencl-headers libopenmpi-dev openmpi-bin
      libsentencepiece-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libxxhash-dev
      libpcre2-dev libicu-dev
      libgtest-dev python3
      bible-kjv bible-kjv-text)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
