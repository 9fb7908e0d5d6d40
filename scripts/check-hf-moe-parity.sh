#!/usr/bin/env bash
# Mixture-of-experts parity with Hugging Face transformers 5 (docs/moe.md, "Hugging Face"):
#
#   scripts/check-hf-moe-parity.sh [VENV]          VENV defaults to /tmp/tetrad-hf5, made with pip
#                                                  if missing (as check-hf-parity.sh --tf5 does)
#   scripts/check-hf-moe-parity.sh --ctest TETRAD  CTest's HfParityMoe: the venv from
#       $TETRAD_HF_VENV or /tmp/tetrad-hf5, never installed; without transformers 5 and torch
#       there it prints "SKIPPED: ..." (CTest counts it skipped, not passed).
#
# For each kind of scripts/hf_moe.py (tiny random MixtralForCausalLM, Qwen3MoeForCausalLM and
# Qwen2MoeForCausalLM, the last with its shared expert, made by transformers, experts saved per
# expert as the Hub has them, or fused as transformers 5 holds them): `tetrad import`, `tetrad logits` against transformers' logits on 48 tokens; the imported
# model exported again with `tetrad export`, loaded by AutoModelForCausalLM, its logits against
# tetrad's; and tetrad-made models (a few training steps) exported and loaded the
# same way. Tolerance: max |difference| / max |logit| <= 1e-5, fp32 throughout. The aux-loss
# table prints transformers' load_balancing_loss_func and tetrad's per-layer mean on the same
# router logits (they differ by definition with more than one layer: docs/moe.md).
# Then the tokenizer: a model trained on data made with the family's kind of tokenizer (Mixtral:
# Llama 2's SentencePiece tokenizer.model, tests/fixtures/tokenizers/sp; Qwen2-MoE and Qwen3-MoE:
# Qwen2's byte-level BPE tokenizer.json, made by scripts/hf_make.py qwen2-tokenizer) and exported; AutoTokenizer on the exported folder must give
# `tetrad tokenize`'s ids on every line of a text set and decode them alike, and
# AutoModelForCausalLM's logits on 48 of those ids must match `tetrad logits`.
# Exits non-zero if any row fails.
set -euo pipefail
cd "$(dirname "$0")/.."
T=./build/tetrad
CTEST=0
if [ "${1:-}" = --ctest ]; then
  CTEST=1
  T=$2
  VENV=${TETRAD_HF_VENV:-/tmp/tetrad-hf5}
else
  VENV=${1:-/tmp/tetrad-hf5}
fi
source scripts/hf5_venv.sh
if [ $CTEST = 1 ] && ! has_hf5 "$VENV"; then
  echo "SKIPPED: no transformers 5.x with torch in $VENV (set TETRAD_HF_VENV, or make it with scripts/check-hf-moe-parity.sh, which installs them from PyPI)"
  exit 0
fi
make_hf5 "$VENV"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
RTOL=1e-5
rel_of() { sed -n 's/.*relative to max |[a-z ]*| [^:]*: \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
abs_of() { sed -n 's/^max |logit difference| = \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }

# 48 tokens spread over the vocabulary (8192).
TOKENS=$(python3 -c "print(','.join(str((i * 2654435761) % 8192) for i in range(1, 49)))")
echo "[$TOKENS]" > "$W/tokens.json"
for i in $(seq 1 200); do echo "the king went up to the city $i, and the people followed him."; done > "$W/c.txt"
"$T" prepare --input "$W/c.txt" --out "$W/data" --vocab-size 300 > /dev/null

KINDS=(mixtral mixtral-tied mixtral-fused qwen3-moe qwen3-moe-norm qwen3-moe-fused qwen2-moe
       qwen2-moe-tied qwen2-moe-fused)
rows=() auxrows=()
for k in "${KINDS[@]}"; do
  "$PY" scripts/hf_moe.py make "$k" "$W/hf_$k" "$W/tokens.json" > "$W/make.log" 2>&1 || { cat "$W/make.log"; exit 1; }
  # HF-made, imported.
  status=ok
  rm -f "$W/cmp.log"
  { "$T" import --hf "$W/hf_$k" --out "$W/imp_$k" > "$W/imp.log" 2>&1 &&
    "$T" logits --model "$W/imp_$k" --tokens "$TOKENS" --out "$W/imp_$k.bin" >> "$W/imp.log" 2>&1 &&
    "$PY" scripts/hf_make.py compare "$W/imp_$k.bin" "$W/hf_$k/hf_logits.bin" --rtol $RTOL > "$W/cmp.log" 2>&1; } ||
    { status=FAIL; fails=$((fails + 1)); cat "$W/imp.log" "$W/cmp.log" 2>/dev/null; }
  rows+=("| $k | HF-made, tetrad import | $(abs_of "$W/cmp.log") | $(rel_of "$W/cmp.log") | $status |")
  # The imported model exported again, loaded by transformers.
  status=ok
  rm -f "$W/cmp.log"
  { "$T" export --model "$W/imp_$k" --out "$W/exp_$k" > "$W/exp.log" 2>&1 &&
    "$PY" scripts/hf_check.py "$W/exp_$k" "$W/tokens.json" "$W/imp_$k.bin" --rtol $RTOL > "$W/cmp.log" 2>&1; } ||
    { status=FAIL; fails=$((fails + 1)); cat "$W/exp.log" "$W/cmp.log" 2>/dev/null; }
  rows+=("| $k | imported, tetrad export, transformers loads | $(sed -n 's/^max |logit difference| = \([0-9.e+-]*\).*/\1/p' "$W/cmp.log") | $(rel_of "$W/cmp.log") | $status |")
  auxrows+=("| $k | $("$PY" -c "import json; d = json.load(open('$W/hf_$k/hf_loss.json')); print(f\"{d['aux_loss']:.6f} | {d['tetrad_aux_loss']:.6f} | {d['cross_entropy']:.6f} | {d['loss_with_aux']:.6f}\")") |")
done

# tetrad-made models, exported, loaded by transformers.
declare -A SETS=(
  [mixtral-tiny]="--set model.name=mixtral-tiny"
  [mixtral-tiny-tied-top1]="--set model.name=mixtral-tiny --set model.tie_embeddings=true --set model.experts_per_token=1"
  [qwen3-moe-tiny]="--set model.name=qwen3-moe-tiny"
  [qwen3-moe-tiny-tied-norm]="--set model.name=qwen3-moe-tiny --set model.tie_embeddings=true --set model.norm_topk_prob=true"
  [qwen2-moe-tiny]="--set model.name=qwen2-moe-tiny"
  [qwen2-moe-tiny-tied-top1]="--set model.name=qwen2-moe-tiny --set model.tie_embeddings=true --set model.experts_per_token=1"
)
TMADE=(mixtral-tiny mixtral-tiny-tied-top1 qwen3-moe-tiny qwen3-moe-tiny-tied-norm qwen2-moe-tiny
       qwen2-moe-tiny-tied-top1)
for k in "${TMADE[@]}"; do
  status=ok
  rm -f "$W/cmp.log"
  # shellcheck disable=SC2086
  { "$T" train ${SETS[$k]} --set model.vocab_size=8192 --set model.max_seq=64 --set data.dir="$W/data" \
      --set train.seq_len=32 --set train.max_steps=3 --set train.eval_interval=0 --set train.precision=fp32 \
      --set run.dir="$W/run_$k" > "$W/train.log" 2>&1 &&
    "$T" logits --model "$W/run_$k" --tokens "$TOKENS" --out "$W/run_$k.bin" >> "$W/train.log" 2>&1 &&
    "$T" export --model "$W/run_$k" --out "$W/texp_$k" >> "$W/train.log" 2>&1 &&
    "$PY" scripts/hf_check.py "$W/texp_$k" "$W/tokens.json" "$W/run_$k.bin" --rtol $RTOL > "$W/cmp.log" 2>&1; } ||
    { status=FAIL; fails=$((fails + 1)); cat "$W/train.log" "$W/cmp.log" 2>/dev/null; }
  rows+=("| $k | tetrad-made, tetrad export, transformers loads | $(sed -n 's/^max |logit difference| = \([0-9.e+-]*\).*/\1/p' "$W/cmp.log") | $(rel_of "$W/cmp.log") | $status |")
done

# The tokenizers: the family's kind of tokenizer, a model trained on data made with it, exported.
FX=tests/fixtures/tokenizers
cat "$FX/kjv_sample.txt" "$FX/stress.txt" /usr/share/common-licenses/Apache-2.0 > "$W/text.txt"
if ! "$PY" -c "import sentencepiece, google.protobuf" 2>/dev/null; then
  if [ $CTEST = 1 ]; then
    echo "SKIPPED: sentencepiece and protobuf are not in $VENV (AutoTokenizer needs them for tokenizer.model)"
    exit 0
  fi
  "$VENV/bin/pip" install -q sentencepiece protobuf
fi
trows=()
"$PY" scripts/hf_make.py qwen2-tokenizer "$W/qwen2_tokenizer" "$FX/kjv_sample.txt" > "$W/qtok.log" 2>&1 ||
  { cat "$W/qtok.log"; fails=$((fails + 1)); }
for name in mixtral-sp qwen2-moe-bpe qwen3-moe-bpe; do
  case $name in
    mixtral-sp) src=(--tokenizer "$FX/sp"); model="--set model.name=mixtral-tiny"; vocab=1000 ;;
    qwen2-moe-bpe) src=(--tokenizer "$W/qwen2_tokenizer"); model="--set model.name=qwen2-moe-tiny"; vocab=1024 ;;
    qwen3-moe-bpe) src=(--tokenizer "$W/qwen2_tokenizer"); model="--set model.name=qwen3-moe-tiny"; vocab=1024 ;;
  esac
  d="$W/tok_$name"
  status=ok
  # shellcheck disable=SC2086
  { "$T" prepare --input "$FX/kjv_sample.txt" --out "$d/data" "${src[@]}" --val-fraction 0.1 > "$W/tok.log" 2>&1 &&
    "$T" train $model --set model.vocab_size=$vocab --set data.dir="$d/data" --set train.seq_len=32 \
      --set train.max_steps=3 --set train.eval_interval=0 --set train.precision=fp32 --set run.dir="$d/run" >> "$W/tok.log" 2>&1 &&
    "$T" export --model "$d/run" --out "$d/hf" >> "$W/tok.log" 2>&1 &&
    "$T" tokenize --tokenizer "$d/hf" < "$W/text.txt" > "$d/ids.txt" 2>> "$W/tok.log" &&
    "$T" tokenize --tokenizer "$d/hf" --decode < "$d/ids.txt" > "$d/decoded.txt" 2>> "$W/tok.log"; } ||
    { status=FAIL; cat "$W/tok.log"; }
  tokline="" rel=""
  if [ $status = ok ]; then
    "$PY" scripts/hf_tokenizer_check.py "$d/hf" "$W/text.txt" "$d/ids.txt" "$d/decoded.txt" > "$d/tok_check.log" 2>&1 ||
      { status=FAIL; cat "$d/tok_check.log"; }
    # "sentencepiece from DIR: 283 lines of TEXT, 9663 ids; ids identical on 283/283 lines, ..."
    tokline=$(head -n 1 "$d/tok_check.log" | sed 's| from [^:]*:||; s| of [^ ]*text.txt||')
    if grep -q "for information" "$d/tok_check.log"; then
      tokline="$tokline; $(grep "for information" "$d/tok_check.log" | sed 's| from [^:]*:||; s| of [^ ]*text.txt||')"
    fi
    awk '{ for (i = 1; i <= NF; i++) if (n < 48) printf "%s%s", (n++ ? "," : ""), $i } END { print "" }' \
      "$d/ids.txt" > "$d/tokens.csv"
    echo "[$(cat "$d/tokens.csv")]" > "$d/tokens.json"
    { "$T" logits --model "$d/hf" --tokens "$(cat "$d/tokens.csv")" --out "$d/logits.bin" > "$d/cmp.log" 2>&1 &&
      "$PY" scripts/hf_check.py "$d/hf" "$d/tokens.json" "$d/logits.bin" --rtol $RTOL >> "$d/cmp.log" 2>&1; } ||
      { status=FAIL; cat "$d/cmp.log"; }
    rel=$(rel_of "$d/cmp.log")
  fi
  [ $status = ok ] || fails=$((fails + 1))
  trows+=("| $name | $tokline | $rel | $status |")
done

echo
echo "transformers $TFV, torch $TV; 48 tokens, fp32, tolerance $RTOL (max |diff| / max |logit|)"
echo "| model | direction | max abs difference | relative max difference | result |"
echo "| --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
echo
echo "aux loss on the same 48 tokens (router_aux_loss_coef 0.02): transformers' load_balancing_loss_func over all layers at once, tetrad's mean of per-layer losses"
echo "| model | transformers aux | tetrad aux | cross-entropy | transformers loss with aux |"
echo "| --- | --- | --- | --- | --- |"
printf '%s\n' "${auxrows[@]}"
echo
echo "tokenizers: AutoTokenizer on the exported folder against tetrad tokenize ($(grep -c '' "$W/text.txt") lines); logits on 48 of the ids"
echo "| tokenizer | AutoTokenizer check | logits relative max difference | result |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${trows[@]}"
[ $fails -eq 0 ]
