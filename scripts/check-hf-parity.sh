#!/usr/bin/env bash
# Checks that Hugging Face transformers and tetrad compute the same logits (within 1e-4 of the
# largest logit), both ways, and that an exported folder's tokenizer encodes as tetrad's. Not
# part of CTest: it needs PyTorch and transformers.
#
#   scripts/check-hf-parity.sh [PYTHON]       transformers 4.x: tetrad-made tiny and llama-tiny
#                                             exported and loaded by transformers. PYTHON
#                                             defaults to /tmp/hfenv/bin/python, made with
#       apt-get install python3-torch python3-venv
#       python3 -m venv --system-site-packages /tmp/hfenv && /tmp/hfenv/bin/pip install 'transformers<4.37'
#   scripts/check-hf-parity.sh --tf5 [VENV]   transformers 5.x from PyPI in VENV (default
#                                             /tmp/tetrad-hf5; made with pip if missing: torch
#                                             from PyPI runs on the CPU, ~3 GB). HF-made GPT-2,
#       Llama with GQA, tied Llama, theta 500000 and llama3-scaled Llama, Qwen2 (q/k/v biases,
#       GQA, theta 1e6) untied and tied, Qwen3 (q/k norms, 24-wide heads of hidden 64 / 4 heads,
#       GQA, theta 1e6) untied and tied, imported with `tetrad import` (tetrad's logits against
#       transformers'), and tetrad-made models of the same nine kinds exported with
#       `tetrad export` and loaded by transformers; prints a table.
#       Then the tokenizer table below.
#   scripts/check-hf-parity.sh --tokenizers [VENV]   only the tokenizer table: for each tokenizer
#       kind (the byte-level BPE fixtures as GPT-2 and Llama 3 write them, one with an NFC
#       normalizer and added tokens, Llama 2's SentencePiece, Qwen2's as transformers'
#       Qwen2Tokenizer writes it (made here, trained on the KJV sample), and a SentencePiece tokenizer that
#       `tetrad prepare` trains), a tiny model is trained on data made with it and exported;
#       transformers' AutoTokenizer loads the exported folder and must give tetrad tokenize's ids
#       on every line of a text set (the KJV sample, the Unicode stress text with invalid UTF-8,
#       the Apache license), and decode them as `tetrad tokenize --decode` does;
#       AutoModelForCausalLM loads the same folder and its logits on 48 of those ids must match
#       `tetrad logits`.
# Needs a build (./build/tetrad). Exits non-zero if any row fails.
set -euo pipefail
cd "$(dirname "$0")/.."
T=./build/tetrad
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# A small corpus for the tetrad-made models' few training steps (as tests/cli_common.sh).
for i in $(seq 1 200); do echo "the king went up to the city $i, and the people followed him."; done > "$W/c.txt"
"$T" prepare --input "$W/c.txt" --out "$W/data" --vocab-size 300 > /dev/null

if [ "${1:-}" != "--tf5" ] && [ "${1:-}" != "--tokenizers" ]; then
  PY=${1:-/tmp/hfenv/bin/python}
  TOKENS="1,50,300,7,99,1000,8000,3,42,42,5"
  echo "[$TOKENS]" > "$W/tokens.json"
  for m in tiny llama-tiny; do
    "$T" train --set model.name=$m --set model.vocab_size=8192 --set run.dir="$W/hf_$m" \
      --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=5 --set train.eval_interval=0 > /dev/null
    "$T" logits --model "$W/hf_$m" --tokens "$TOKENS" --out "$W/logits_$m.bin"
    "$T" export --model "$W/hf_$m" --out "$W/hf_$m/hf"
    "$PY" scripts/hf_check.py "$W/hf_$m/hf" "$W/tokens.json" "$W/logits_$m.bin"
  done
  exit 0
fi

MODE=$1
VENV=${2:-/tmp/tetrad-hf5}
source scripts/hf5_venv.sh
make_hf5 "$VENV"
case "$TFV" in 5.*) ;; *) echo "expected transformers 5.x in $VENV, found $TFV"; exit 2 ;; esac
if ! "$PY" -c "import sentencepiece, google.protobuf" 2>/dev/null; then
  echo "== installing sentencepiece and protobuf into $VENV (AutoTokenizer needs them for tokenizer.model)"
  "$VENV/bin/pip" install -q sentencepiece protobuf
fi
fails=0
rel_of() { sed -n 's/.*relative to max |[a-z ]*| [^:]*: \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }

# The tokenizer table: AutoTokenizer and AutoModelForCausalLM on exported folders.
tokenizer_table() {
  local FX=tests/fixtures/tokenizers
  cat "$FX/kjv_sample.txt" "$FX/stress.txt" /usr/share/common-licenses/Apache-2.0 > "$W/text.txt"
  local name src model vocab status trows=() row
  "$PY" scripts/hf_make.py qwen2-tokenizer "$W/qwen2_tokenizer" "$FX/kjv_sample.txt" > "$W/qtok.log" 2>&1 ||
    { cat "$W/qtok.log"; fails=$((fails + 1)); }
  for name in gpt2 llama3 nfc sp qwen2 tetrad-sp; do
    case $name in
      qwen2) src=(--tokenizer "$W/qwen2_tokenizer"); model="--set model.name=qwen2-tiny"; vocab=1024 ;;
      gpt2|nfc) src=(--tokenizer "$FX/$name"); model="--set model.name=tiny"; vocab=1024 ;;
      llama3) src=(--tokenizer "$FX/$name"); model="--set model.name=llama-tiny"; vocab=1024 ;;
      sp) src=(--tokenizer "$FX/$name"); model="--set model.name=llama-tiny"; vocab=1000 ;;
      tetrad-sp) src=(--vocab-size 400); model="--set model.name=tiny"; vocab=400 ;;
    esac
    local d="$W/tok_$name"
    status=ok
    # shellcheck disable=SC2086
    { "$T" prepare --input "$FX/kjv_sample.txt" --out "$d/data" "${src[@]}" --val-fraction 0.1 > "$W/tok.log" 2>&1 &&
      "$T" train $model --set model.vocab_size=$vocab --set data.dir="$d/data" --set train.seq_len=32 \
        --set train.max_steps=3 --set train.eval_interval=0 --set run.dir="$d/run" >> "$W/tok.log" 2>&1 &&
      "$T" export --model "$d/run" --out "$d/hf" >> "$W/tok.log" 2>&1 &&
      "$T" tokenize --tokenizer "$d/hf" < "$W/text.txt" > "$d/ids.txt" 2>> "$W/tok.log" &&
      "$T" tokenize --tokenizer "$d/hf" --decode < "$d/ids.txt" > "$d/decoded.txt" 2>> "$W/tok.log"; } ||
      { status=FAIL; cat "$W/tok.log"; }
    local tokline="" cmpline="" rel=""
    if [ $status = ok ]; then
      "$PY" scripts/hf_tokenizer_check.py "$d/hf" "$W/text.txt" "$d/ids.txt" "$d/decoded.txt" > "$d/tok_check.log" 2>&1 ||
        { status=FAIL; cat "$d/tok_check.log"; }
      tokline=$(head -n 1 "$d/tok_check.log")
      # 48 of the text's ids (the model holds 64 positions), tetrad's logits against transformers'.
      awk '{ for (i = 1; i <= NF; i++) if (n < 48) printf "%s%s", (n++ ? "," : ""), $i } END { print "" }' \
        "$d/ids.txt" > "$d/tokens.csv"
      echo "[$(cat "$d/tokens.csv")]" > "$d/tokens.json"
      { "$T" logits --model "$d/hf" --tokens "$(cat "$d/tokens.csv")" --out "$d/logits.bin" > "$d/cmp.log" 2>&1 &&
        "$PY" scripts/hf_check.py "$d/hf" "$d/tokens.json" "$d/logits.bin" >> "$d/cmp.log" 2>&1; } ||
        { status=FAIL; cat "$d/cmp.log"; }
      rel=$(rel_of "$d/cmp.log")
    fi
    [ $status = ok ] || fails=$((fails + 1))
    # "LlamaTokenizer from DIR: 2 lines of TEXT, 9 ids; ids identical on 2/2 lines, decode identical on 2/2"
    local cls ids same dsame info=""
    cls=$(sed -n 's/^\([A-Za-z0-9]*\) from .*/\1/p' <<<"$tokline")
    ids=$(sed -n 's/.*, \([0-9]*\) ids;.*/\1/p' <<<"$tokline")
    same=$(sed -n 's/.*ids identical on \([0-9/]*\) lines.*/\1/p' <<<"$tokline")
    dsame=$(sed -n 's/.*decode identical on \([0-9/]*\).*/\1/p' <<<"$tokline")
    # A tokenizer.model is judged against sentencepiece; AutoTokenizer's agreement for information.
    if [ -f "$d/tok_check.log" ] && grep -q "for information" "$d/tok_check.log"; then
      local il; il=$(grep "for information" "$d/tok_check.log")
      info="$(sed -n 's/^\([A-Za-z0-9]*\) from .*/\1/p' <<<"$il"): ids $(sed -n 's/.*ids identical on \([0-9/]*\) lines.*/\1/p' <<<"$il"), decode $(sed -n 's/.*decode identical on \([0-9/]*\).*/\1/p' <<<"$il")"
    fi
    local declared
    declared=$(sed -n 's/.*"tokenizer_class": "\([^"]*\)".*/\1/p' "$d/hf/tokenizer_config.json" 2>/dev/null)
    trows+=("| $name | $declared | AutoTokenizer.from_pretrained -> $(sed -n 's/^\([A-Za-z0-9]*\) from .*/\1/p' "$d/tok_check.log" 2>/dev/null | tail -n 1) | $cls | $same | $ids | $dsame | ${info:-same} | $rel | $status |")
  done
  echo
  echo "exported folders: AutoTokenizer against tetrad tokenize on $(grep -c '' "$W/text.txt") lines (KJV sample, Unicode stress text, Apache-2.0); AutoModelForCausalLM logits on 48 of those ids, tolerance 1e-4"
  echo "| tokenizer | tokenizer_class written | loaded as | ids compared with | lines with identical ids | ids | lines decoded identically | AutoTokenizer | logits relative max difference | result |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${trows[@]}"
}
if [ "$MODE" = --tokenizers ]; then
  tokenizer_table
  echo "transformers $TFV, torch $TV"
  [ $fails -eq 0 ]
  exit
fi

# 48 tokens spread over the vocabulary (8192): positions reach past every rope band edge.
TOKENS=$(python3 -c "print(','.join(str((i * 2654435761) % 8192) for i in range(1, 49)))")
echo "[$TOKENS]" > "$W/tokens.json"

declare -A SETS=(
  [gpt2]="--set model.name=tiny"
  [llama-gqa]="--set model.name=llama-tiny"
  [llama-tied]="--set model.name=llama-tiny --set model.tie_embeddings=true --set model.n_kv_head=4"
  [llama-theta500k]="--set model.name=llama-tiny --set model.rope_theta=500000"
  [llama3-scaled]="--set model.name=llama-tiny --set model.rope_theta=500000 --set model.max_seq=128 --set model.rope_type=llama3 --set model.rope_factor=8 --set model.rope_low_freq_factor=1 --set model.rope_high_freq_factor=4 --set model.rope_original_max_position=64"
  [qwen2]="--set model.name=qwen2-tiny --set model.tie_embeddings=false"
  [qwen2-tied]="--set model.name=qwen2-tiny --set model.n_kv_head=4"
  [qwen3]="--set model.name=qwen3-tiny --set model.tie_embeddings=false"
  [qwen3-tied]="--set model.name=qwen3-tiny --set model.n_kv_head=4"
)
KINDS=(gpt2 llama-gqa llama-tied llama-theta500k llama3-scaled qwen2 qwen2-tied qwen3 qwen3-tied)
rows=()
for k in "${KINDS[@]}"; do
  # Issue 32 asks 1e-5 of the Qwen families in fp32; the older rows keep 1e-4.
  rtol=1e-4
  case $k in qwen3*) rtol=1e-5 ;; esac
  # HF-made, imported.
  "$PY" scripts/hf_make.py make "$k" "$W/hf_$k" "$W/tokens.json" > "$W/make.log" 2>&1 || { cat "$W/make.log"; exit 1; }
  status=ok
  { "$T" import --hf "$W/hf_$k" --out "$W/imp_$k" > "$W/imp.log" 2>&1 &&
    "$T" logits --model "$W/imp_$k" --tokens "$TOKENS" --out "$W/imp_$k.bin" >> "$W/imp.log" 2>&1 &&
    "$PY" scripts/hf_make.py compare "$W/imp_$k.bin" "$W/hf_$k/hf_logits.bin" --rtol "$rtol" > "$W/cmp.log" 2>&1; } ||
    { status=FAIL; fails=$((fails+1)); cat "$W/imp.log" "$W/cmp.log" 2>/dev/null; }
  rows+=("| $k | HF-made, tetrad import | $(rel_of "$W/cmp.log") (tolerance $rtol) | $status |")
  # tetrad-made, exported.
  status=ok
  # shellcheck disable=SC2086
  { "$T" train ${SETS[$k]} --set model.vocab_size=8192 --set data.dir="$W/data" --set train.seq_len=32 \
      --set train.max_steps=3 --set train.eval_interval=0 --set run.dir="$W/run_$k" > "$W/train.log" 2>&1 &&
    "$T" logits --model "$W/run_$k" --tokens "$TOKENS" --out "$W/run_$k.bin" >> "$W/train.log" 2>&1 &&
    "$T" export --model "$W/run_$k" --out "$W/exp_$k" >> "$W/train.log" 2>&1 &&
    "$PY" scripts/hf_check.py "$W/exp_$k" "$W/tokens.json" "$W/run_$k.bin" --rtol "$rtol" > "$W/cmp.log" 2>&1; } ||
    { status=FAIL; fails=$((fails+1)); cat "$W/train.log" "$W/cmp.log" 2>/dev/null; }
  rows+=("| $k | tetrad-made, tetrad export | $(rel_of "$W/cmp.log") (tolerance $rtol) | $status |")
done
# Control: the llama3-scaled and theta-500000 models have the same weights (same seed and
# shapes), so their logits differ only by the scaling; the check must be able to see it.
"$PY" scripts/hf_make.py compare "$W/imp_llama3-scaled.bin" "$W/hf_llama-theta500k/hf_logits.bin" > "$W/cmp.log" 2>&1 &&
  { echo "control failed: llama3 scaling made no difference"; fails=$((fails+1)); }
rows+=("| control: llama3-scaled (tetrad) vs theta 500000 (HF) | scaling changes the logits | $(rel_of "$W/cmp.log") | $(grep -q FAIL "$W/cmp.log" && echo "ok (differs)" || echo FAIL) |")
echo
echo "transformers $TFV, torch $TV; ${#KINDS[@]} models x 2 directions, 48 tokens, tolerance 1e-4 (Qwen3: 1e-5) (max |diff| / max |logit|)"
echo "| model | direction | relative max difference | result |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
tokenizer_table
[ $fails -eq 0 ]
