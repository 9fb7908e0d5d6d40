# Sourced by scripts/check-hf-parity.sh (--tf5, --tokenizers) and scripts/check-hf-moe-parity.sh:
# the Python environment with Hugging Face transformers 5.
#
# has_hf5 VENV: VENV's python imports torch and a transformers 5.x.
# make_hf5 VENV: makes VENV (transformers 5.x, torch and safetensors from PyPI; torch runs on the
# CPU, ~3 GB) unless has_hf5; then PY is its python, TFV transformers' version, TV torch's.
has_hf5() {
  [ -x "$1/bin/python" ] &&
    "$1/bin/python" -c "import torch, transformers, sys; sys.exit(0 if transformers.__version__.startswith('5.') else 1)" 2>/dev/null
}
make_hf5() {
  if ! has_hf5 "$1"; then
    echo "== making $1 (transformers 5.x, torch and safetensors from PyPI)"
    python3 -m venv "$1"
    "$1/bin/pip" install -q 'transformers>=5,<6' torch safetensors
  fi
  PY="$1/bin/python"
  TFV=$("$PY" -c "import transformers; print(transformers.__version__)")
  TV=$("$PY" -c "import torch; print(torch.__version__)")
}
