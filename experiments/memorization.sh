#!/usr/bin/env bash
# The memorization experiment (issue 8, docs: ../shared/design/memorization.md): train the same
# model on the corpus plus canary documents repeated R times, once with the standard loss and once
# with the Goldfish loss (k = 4, h = 13), then measure extraction of the canaries and the held-out
# loss; print the table and write a plot (SVG) of extraction rate against repetitions.
#   experiments/memorization.sh quick   tiny model, a slice of the Bible, seconds (CI)
#   experiments/memorization.sh full    4-layer model, the whole Bible, ~20 minutes on 2 cores
# Exits non-zero in quick mode unless the standard model memorises its canaries more than the
# Goldfish model does.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-quick}
TETRAD=${TETRAD:-./build/tetrad}
OUT=${OUT:-runs/memorization-$MODE}
rm -rf "$OUT"; mkdir -p "$OUT"
REPEATS="1,4,16,64"
if [ "$MODE" = quick ]; then
  bible -f "Gen1:1-Gen20:18" > "$OUT/corpus.txt"
  MODEL=(--set model.name=tiny --set model.vocab_size=512)
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=64 --set train.max_steps=600 --set train.lr=3e-3
         --set train.warmup_steps=20 --set train.eval_interval=0 --set train.log_interval=100)
  VOCAB=512; PREFIX=16; SUFFIX=32
else
  bible -f "Gen1:1-Rev22:21" > "$OUT/corpus.txt"
  # A 4-layer GPT-2 (256 wide, 8192-token vocabulary): about 10 minutes per loss on 2 cores.
  MODEL=(--set model.name=small --set model.n_layer=4 --set model.n_embd=256 --set model.n_head=4
         --set model.n_kv_head=4 --set model.ffn=1024 --set model.max_seq=128)
  TRAIN=(--set train.micro_batch=8 --set train.seq_len=128 --set train.max_steps=1500 --set train.lr=2e-3
         --set train.warmup_steps=100 --set train.eval_interval=0 --set train.log_interval=100)
  VOCAB=8192; PREFIX=32; SUFFIX=50  # 82 tokens: fits the 128-token model
fi
# Canaries: one per repeat count, random words (never in the Bible), long enough for
# prefix + suffix tokens.
i=0
for r in ${REPEATS//,/ }; do
  awk -v seed=$((1000 + i)) 'BEGIN { srand(seed); n = split("amber basalt cobalt dune ember fjord glyph harbor ivory jasper kelp lumen mosaic nectar onyx prism quasar raven saffron tundra umber velvet wharf xenon yonder zephyr", w, " ");
    for (j = 0; j < 90; j++) printf "%s%s", w[int(rand() * n) + 1], (j % 12 == 11 ? ".\n" : " "); }' > "$OUT/canary_r$r.txt"
  i=$((i + 1))
done
CANARIES=(); for r in ${REPEATS//,/ }; do CANARIES+=(--canary "$OUT/canary_r$r.txt"); done
"$TETRAD" prepare --input "$OUT/corpus.txt" --out "$OUT/data" --vocab-size $VOCAB --val-fraction 0.05 \
  "${CANARIES[@]}" --canary-repeats "$REPEATS" > "$OUT/prepare.log"

for loss in standard goldfish; do
  MASK=(); [ $loss = goldfish ] && MASK=(--set train.loss_mask=goldfish --set train.goldfish_k=4 --set train.goldfish_h=13)
  "$TETRAD" train "${MODEL[@]}" "${TRAIN[@]}" "${MASK[@]}" --set data.dir="$OUT/data" \
    --set run.dir="$OUT/$loss" | grep -E "^step|loss mask" || true
  "$TETRAD" memorization --model "$OUT/$loss" --prefix $PREFIX --suffix $SUFFIX \
    --json "$OUT/$loss/extraction.json" "$OUT"/canary_r*.txt > "$OUT/$loss/extraction.txt"
  "$TETRAD" eval --model "$OUT/$loss" --data "$OUT/data" --split val --batches 8 \
    --seq-len "$( [ "$MODE" = quick ] && echo 64 || echo 128 )" | tail -1 > "$OUT/$loss/val.txt"
done

python3 experiments/memorization_report.py "$OUT" "$REPEATS" "$MODE"
