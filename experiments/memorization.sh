#!/usr/bin/env bash
# The memorization experiment (issue 8, docs: ../shared/design/memorization.md): train the same
# model on the corpus plus canary documents repeated R times, once with the standard loss and once
# with the Goldfish loss (k = 4, h = 13), then measure extraction of the canaries and the held-out
# loss; print the table and write a plot (SVG) of extraction rate against repetitions.
#   experiments/memorization.sh quick   tiny model, a slice of the Bible, seconds (CI)
#   experiments/memorization.sh full    4-layer model, the whole Bible, ~20 minutes on 2 cores
#                                       (REPEATS, PER_R, STEPS override its settings)
# Exits non-zero in quick mode unless the standard model memorises its canaries more than the
# Goldfish model does.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-quick}
TETRAD=${TETRAD:-./build/tetrad}
OUT=${OUT:-runs/memorization-$MODE}
rm -rf "$OUT"; mkdir -p "$OUT"
if [ "$MODE" = quick ]; then
  REPEATS="1,4,16,64"; PER_R=1
  bible -f "Gen1:1-Gen20:18" > "$OUT/corpus.txt"
  MODEL=(--set model.name=tiny --set model.vocab_size=512)
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=64 --set train.max_steps=600 --set train.lr=3e-3
         --set train.warmup_steps=20 --set train.eval_interval=0 --set train.log_interval=100)
  VOCAB=512; PREFIX=16; SUFFIX=32; SEQ=64; EVALB=8
else
  # 16 canaries, 4 per repetition count; the paper repeated its documents 50 to 100 times.
  REPEATS="${REPEATS:-32,64,128,256}"; PER_R=${PER_R:-4}
  bible -f "Gen1:1-Rev22:21" > "$OUT/corpus.txt"
  # A 4-layer GPT-2 (256 wide, 8192-token vocabulary): about 10 minutes per loss on 2 quiet cores.
  MODEL=(--set model.name=small --set model.n_layer=4 --set model.n_embd=256 --set model.n_head=4
         --set model.n_kv_head=4 --set model.ffn=1024 --set model.max_seq=128)
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=128 --set train.max_steps=${STEPS:-1500} --set train.lr=2e-3
         --set train.warmup_steps=100 --set train.eval_interval=0 --set train.log_interval=100)
  VOCAB=8192; PREFIX=32; SUFFIX=50; SEQ=128; EVALB=64  # 82 tokens: fits the 128-token model
fi
# Canaries, named canary_r<R>_<i>.txt. Quick mode: random words (never in the Bible), long enough
# for prefix + suffix tokens. Full mode: real English the corpus has never seen, the paragraphs of
# the GNU GPL v3 (shipped by Debian's base-files on every machine), about 100 words each.
CANARIES=(); COUNTS=()
i=0
for r in ${REPEATS//,/ }; do
  for j in $(seq 1 $PER_R); do
    f="$OUT/canary_r${r}_$j.txt"
    if [ "$MODE" = quick ]; then
      awk -v seed=$((1000 + i)) 'BEGIN { srand(seed); n = split("amber basalt cobalt dune ember fjord glyph harbor ivory jasper kelp lumen mosaic nectar onyx prism quasar raven saffron tundra umber velvet wharf xenon yonder zephyr", w, " ");
        for (j = 0; j < 90; j++) printf "%s%s", w[int(rand() * n) + 1], (j % 12 == 11 ? ".\n" : " "); }' > "$f"
    else
      # The (i+1)-th paragraph of at least 80 words, cut to its first 100 words.
      awk -v want=$((i + 1)) 'BEGIN { RS = ""; n = 0 } NF >= 80 { if (++n == want) { for (k = 1; k <= NF && k <= 100; k++) printf "%s%s", $k, (k % 14 == 0 ? "\n" : " "); print ""; exit } }' \
        /usr/share/common-licenses/GPL-3 > "$f"
      [ -s "$f" ] || { echo "not enough paragraphs in /usr/share/common-licenses/GPL-3 for canary $((i + 1))" >&2; exit 1; }
    fi
    CANARIES+=(--canary "$f"); COUNTS+=($r)
    i=$((i + 1))
  done
done
"$TETRAD" prepare --input "$OUT/corpus.txt" --out "$OUT/data" --vocab-size $VOCAB --val-fraction 0.05 \
  "${CANARIES[@]}" --canary-repeats "$(IFS=,; echo "${COUNTS[*]}")" > "$OUT/prepare.log"

for loss in standard goldfish; do
  MASK=(); [ $loss = goldfish ] && MASK=(--set train.loss_mask=goldfish --set train.goldfish_k=4 --set train.goldfish_h=13)
  "$TETRAD" train "${MODEL[@]}" "${TRAIN[@]}" "${MASK[@]}" --set data.dir="$OUT/data" \
    --set run.dir="$OUT/$loss" | grep -E "^step|loss mask" || true
  "$TETRAD" memorization --model "$OUT/$loss" --prefix $PREFIX --suffix $SUFFIX \
    --json "$OUT/$loss/extraction.json" "$OUT"/canary_r*.txt > "$OUT/$loss/extraction.txt"
  # The extraction rate of ordinary training text, for comparison (evenly spaced windows).
  "$TETRAD" memorization --model "$OUT/$loss" --prefix $PREFIX --suffix $SUFFIX \
    --data "$OUT/data" --samples 32 --json "$OUT/$loss/extraction_train.json" > /dev/null
  "$TETRAD" eval --model "$OUT/$loss" --data "$OUT/data" --split val --batches $EVALB \
    --seq-len $SEQ | tail -1 > "$OUT/$loss/val.txt"
done

python3 experiments/memorization_report.py "$OUT" "$REPEATS" "$MODE"
