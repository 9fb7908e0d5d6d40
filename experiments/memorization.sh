#!/usr/bin/env bash
# The memorization experiment (issues 8 and 20, docs: ../shared/design/memorization.md): train the
# same model on a corpus plus canary documents repeated R times, once with the standard loss and
# once with the Goldfish loss (k = 4, h = 13), then measure extraction of the canaries and the
# held-out loss; print the table and write a plot (SVG) of extraction rate against repetitions.
#
# Pretraining (from random weights, on the King James Bible):
#   experiments/memorization.sh quick          tiny model, a slice of the Bible, seconds (CI)
#   experiments/memorization.sh full           4-layer model, the whole Bible, ~20 minutes on 2
#                                              cores (REPEATS, PER_R, STEPS override its settings)
# Fine-tuning (from a pretrained model, on a second corpus: the software licenses every Debian
# ships in /usr/share/common-licenses, as JSON lines, one paragraph a line):
#   experiments/memorization.sh finetune-quick  tiny base pretrained here on a slice of the Bible,
#                                              seconds (CI)
#   experiments/memorization.sh finetune       4-layer base pretrained here on the whole Bible
#                                              (BASE_STEPS, 1000), then fine-tuned (STEPS, 800);
#                                              REPEATS, PER_R, LR override; about 15 minutes of
#                                              one quiet core. BASE=HF_DIR fine-tunes that model
#                                              instead (its config.json and tokenizer; e.g. a KJV
#                                              model made with `tetrad export`).
# The fine-tuning modes measure the base model too (its extraction before fine-tuning is the
# baseline) and hold back one canary group, R = 0, never planted: the extraction fine-tuning on
# the corpus alone gives.
# Exits non-zero in the quick modes unless the standard model memorises its canaries more than the
# Goldfish model does (finetune-quick checks more, see memorization_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-quick}
TETRAD=${TETRAD:-./build/tetrad}
OUT=${OUT:-runs/memorization-$MODE}
case "$MODE" in
  quick|full|finetune-quick|finetune) ;;
  *) echo "usage: $0 quick|full|finetune-quick|finetune (got '$MODE')" >&2; exit 2 ;;
esac
rm -rf "$OUT"; mkdir -p "$OUT"
LOSSES=(standard goldfish)
case "$MODE" in
quick)
  REPEATS="1,4,16,64"; PER_R=1
  bible -f "Gen1:1-Gen20:18" > "$OUT/corpus.txt"
  MODEL=(--set model.name=tiny --set model.vocab_size=512)
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=64 --set train.max_steps=600 --set train.lr=3e-3
         --set train.warmup_steps=20 --set train.eval_interval=0 --set train.log_interval=100)
  VOCAB=512; PREFIX=16; SUFFIX=32; SEQ=64; EVALB=8; CANARY_WORDS=90 ;;
full)
  # 16 canaries, 4 per repetition count; the paper repeated its documents 50 to 100 times.
  REPEATS="${REPEATS:-32,64,128,256}"; PER_R=${PER_R:-4}
  bible -f "Gen1:1-Rev22:21" > "$OUT/corpus.txt"
  # A 4-layer GPT-2 (256 wide, 8192-token vocabulary): about 10 minutes per loss on 2 quiet cores.
  MODEL=(--set model.name=small --set model.n_layer=4 --set model.n_embd=256 --set model.n_head=4
         --set model.n_kv_head=4 --set model.ffn=1024 --set model.max_seq=128)
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=128 --set train.max_steps=${STEPS:-1500} --set train.lr=2e-3
         --set train.warmup_steps=100 --set train.eval_interval=0 --set train.log_interval=100)
  VOCAB=8192; PREFIX=32; SUFFIX=50; SEQ=128; EVALB=64 ;;  # 82 tokens: fits the 128-token model
finetune-quick)
  # R = 0: canaries held back (never in the data). The base learns a slice of the Bible first.
  REPEATS="0,1,4,16,64"; PER_R=1
  bible -f "Gen1:1-Gen20:18" > "$OUT/base_corpus.txt"
  BASE_MODEL=(--set model.name=tiny --set model.vocab_size=512)
  BASE_TRAIN=(--set train.micro_batch=8 --set train.seq_len=64 --set train.max_steps=${BASE_STEPS:-300}
              --set train.lr=3e-3 --set train.warmup_steps=20)
  # Fine-tuning: 1000 steps, about 17 passes over the data (the tiny model needs them to
  # memorise even its most repeated canaries).
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=64 --set train.max_steps=${STEPS:-1000} --set train.lr=${LR:-3e-3}
         --set train.warmup_steps=20)
  # Canaries of 14 words (about 65 tokens with the base's tokenizer; 48 are measured) and a
  # third of the licenses.
  VOCAB=512; PREFIX=16; SUFFIX=32; SEQ=64; EVALB=8; CANARY_WORDS=${CANARY_WORDS:-14}
  FT_CORPUS=(Apache-2.0 Artistic BSD CC0-1.0 MPL-2.0) ;;
finetune)
  # 16 GPL v3 paragraphs, 4 per repetition count; R = 0: held back. Fine-tuning runs about 11
  # passes over the data, so a canary planted R times is seen about 11R times.
  REPEATS="${REPEATS:-0,2,8,32}"; PER_R=${PER_R:-4}
  bible -f "Gen1:1-Rev22:21" > "$OUT/base_corpus.txt"
  # The base: the full mode's 4-layer GPT-2 (256 wide, 8192-token vocabulary, 5.3 M parameters).
  BASE_MODEL=(--set model.name=small --set model.n_layer=4 --set model.n_embd=256 --set model.n_head=4
              --set model.n_kv_head=4 --set model.ffn=1024 --set model.max_seq=128)
  BASE_TRAIN=(--set train.micro_batch=8 --set train.seq_len=128 --set train.max_steps=${BASE_STEPS:-1000}
              --set train.lr=2e-3 --set train.warmup_steps=100)
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=128 --set train.max_steps=${STEPS:-800} --set train.lr=${LR:-2e-3}
         --set train.warmup_steps=50)
  # Held-out: 5 x 4 x 128 tokens, about the whole validation split of the licenses.
  VOCAB=8192; PREFIX=32; SUFFIX=50; SEQ=128; EVALB=5
  FT_CORPUS=(Apache-2.0 Artistic BSD CC0-1.0 GFDL-1.2 GFDL-1.3 MPL-1.1 MPL-2.0) ;;
esac
QUIET=(--set train.eval_interval=0 --set train.log_interval=100)

# Canaries, named canary_r<R>_<i>.txt. Quick modes: random words (never in the Bible or the
# licenses), long enough for prefix + suffix tokens. Full modes: real English the corpora have
# never seen, the paragraphs of the GNU GPL v3 (shipped by Debian's base-files on every machine),
# about 100 words each.
CANARIES=(); COUNTS=()
i=0
for r in ${REPEATS//,/ }; do
  for j in $(seq 1 $PER_R); do
    f="$OUT/canary_r${r}_$j.txt"
    case "$MODE" in
    quick|finetune-quick)
      awk -v seed=$((1000 + i)) -v words=$CANARY_WORDS 'BEGIN { srand(seed); n = split("amber basalt cobalt dune ember fjord glyph harbor ivory jasper kelp lumen mosaic nectar onyx prism quasar raven saffron tundra umber velvet wharf xenon yonder zephyr", w, " ");
        for (j = 0; j < words; j++) printf "%s%s", w[int(rand() * n) + 1], (j % 12 == 11 ? ".\n" : " "); }' > "$f" ;;
    *)
      # The (i+1)-th paragraph of at least 80 words, cut to its first 100 words.
      awk -v want=$((i + 1)) 'BEGIN { RS = ""; n = 0 } NF >= 80 { if (++n == want) { for (k = 1; k <= NF && k <= 100; k++) printf "%s%s", $k, (k % 14 == 0 ? "\n" : " "); print ""; exit } }' \
        /usr/share/common-licenses/GPL-3 > "$f"
      [ -s "$f" ] || { echo "not enough paragraphs in /usr/share/common-licenses/GPL-3 for canary $((i + 1))" >&2; exit 1; } ;;
    esac
    # R = 0: measured, never planted.
    [ "$r" -gt 0 ] && { CANARIES+=(--canary "$f"); COUNTS+=($r); }
    i=$((i + 1))
  done
done

# measure NAME MODEL_DIR: extraction of every canary, of ordinary training text (evenly spaced
# windows of the training shards, for comparison) and the held-out loss.
measure() {
  local name=$1 model=$2
  mkdir -p "$OUT/$name"
  "$TETRAD" memorization --model "$model" --prefix $PREFIX --suffix $SUFFIX \
    --json "$OUT/$name/extraction.json" "$OUT"/canary_r*.txt > "$OUT/$name/extraction.txt"
  "$TETRAD" memorization --model "$model" --prefix $PREFIX --suffix $SUFFIX \
    --data "$OUT/data" --samples 32 --json "$OUT/$name/extraction_train.json" > /dev/null
  "$TETRAD" eval --model "$model" --data "$OUT/data" --split val --batches $EVALB \
    --seq-len $SEQ | tail -1 > "$OUT/$name/val.txt"
}

case "$MODE" in
quick|full)
  "$TETRAD" prepare --input "$OUT/corpus.txt" --out "$OUT/data" --vocab-size $VOCAB --val-fraction 0.05 \
    "${CANARIES[@]}" --canary-repeats "$(IFS=,; echo "${COUNTS[*]}")" > "$OUT/prepare.log"
  for loss in "${LOSSES[@]}"; do
    MASK=(); [ $loss = goldfish ] && MASK=(--set train.loss_mask=goldfish --set train.goldfish_k=4 --set train.goldfish_h=13)
    "$TETRAD" train "${MODEL[@]}" "${TRAIN[@]}" "${MASK[@]}" --set data.dir="$OUT/data" \
      --set run.dir="$OUT/$loss" | { grep -E "^step|loss mask" || true; }
    measure $loss "$OUT/$loss"
  done ;;
*)
  # The base model: BASE, or pretrained here on the Bible (standard loss, no canaries) and
  # exported as a Hugging Face folder, as a published model would be.
  if [ -n "${BASE:-}" ]; then
    BASE_HF=$(cd "$BASE" && pwd)
    echo "base model: $BASE_HF"
  else
    echo "== pretraining the base model on the Bible"
    "$TETRAD" prepare --input "$OUT/base_corpus.txt" --out "$OUT/base_data" --vocab-size $VOCAB \
      --val-fraction 0.05 > "$OUT/base_prepare.log"
    "$TETRAD" train "${BASE_MODEL[@]}" "${BASE_TRAIN[@]}" "${QUIET[@]}" --set data.dir="$OUT/base_data" \
      --set run.dir="$OUT/base_run" | { grep -E "^step" || true; }
    "$TETRAD" export --model "$OUT/base_run" --out "$OUT/base_hf" > /dev/null
    BASE_HF=$OUT/base_hf
  fi
  # The fine-tuning corpus: every license paragraph as a JSON line, but not the GNU GPL and LGPL
  # (the canaries are GPL v3 paragraphs, and the GPL v2 and LGPL paraphrase them).
  python3 - "$OUT/finetune.jsonl" "${FT_CORPUS[@]/#//usr/share/common-licenses/}" <<'PY'
import json, re, sys
with open(sys.argv[1], "w") as out:
    for path in sys.argv[2:]:
        for para in re.split(r"\n\s*\n", open(path, encoding="utf-8").read()):
            if para.strip():
                out.write(json.dumps({"text": para.strip()}) + "\n")
PY
  # Prepared with the base model's own tokenizer (train refuses anything else).
  "$TETRAD" prepare --input "$OUT/finetune.jsonl" --text-field text --tokenizer "$BASE_HF" \
    --out "$OUT/data" --val-fraction 0.1 "${CANARIES[@]}" \
    --canary-repeats "$(IFS=,; echo "${COUNTS[*]}")" > "$OUT/prepare.log"
  echo "== base model before fine-tuning"
  measure base "$BASE_HF"
  for loss in "${LOSSES[@]}"; do
    echo "== fine-tuning, $loss loss"
    MASK=(); [ $loss = goldfish ] && MASK=(--set train.loss_mask=goldfish --set train.goldfish_k=4 --set train.goldfish_h=13)
    # No [model] keys: the model is the one in run.init_from's config.json.
    "$TETRAD" train "${TRAIN[@]}" "${QUIET[@]}" "${MASK[@]}" --set run.init_from="$BASE_HF" \
      --set data.dir="$OUT/data" --set run.dir="$OUT/$loss" | { grep -E "^step|loss mask|initialised" || true; }
    measure $loss "$OUT/$loss"
  done ;;
esac

python3 experiments/memorization_report.py "$OUT" "$REPEATS" "$MODE"
