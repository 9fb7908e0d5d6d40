#!/usr/bin/env bash
# The README's fine-tuning walkthrough on tiny models: a Hugging Face folder (config.json,
# model.safetensors, tokenizer.json + tokenizer_config.json) -> import -> prepare JSON lines with
# the model's tokenizer -> fine-tune from it (run.init_from) on a 2-rank grid -> export -> the
# exported folder holds the same tokenizer and a complete config, and tetrad reads it back.
set -uo pipefail
TETRAD=$1
FX=$(cd "$(dirname "$0")/fixtures/tokenizers" && pwd)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1
source "$(dirname "$0")/checks.sh"

# The "published" model: a tiny GPT-2 with the fixture's byte-level BPE, exported as HF folder.
"$TETRAD" prepare --input "$FX/kjv_sample.txt" --out "$W/base_data" --tokenizer "$FX/gpt2" \
  --val-fraction 0.1 > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
M=(--set model.name=tiny --set model.vocab_size=1000 --set train.seq_len=32
   --set train.eval_interval=0 --set train.checkpoint_interval=0)
check "base model trains" "$TETRAD" train "${M[@]}" --set data.dir="$W/base_data" \
  --set run.dir="$W/base_run" --set train.max_steps=3 > "$W/log" 2>&1
check "base model exports" "$TETRAD" export --model "$W/base_run" --out "$W/hf" > "$W/log" 2>&1
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  check "hf folder has $f" test -f "$W/hf/$f"
done
check "tokenizer.json unchanged" cmp -s "$W/hf/tokenizer.json" "$FX/gpt2/tokenizer.json"
check "config.json names eos" grep -q '"eos_token_id": 0' "$W/hf/config.json"

# 1. import (keeps the tokenizer), 2. prepare fine-tuning data with the model's tokenizer.
check "import" "$TETRAD" import --hf "$W/hf" --out "$W/imported" > "$W/log" 2>&1
check "imported checkpoint has the tokenizer" bash -c "ls $W/imported/checkpoints/*/tokenizer.json"
for i in $(seq 1 60); do echo "{\"text\": \"Blessed are the meek $i, for they shall inherit the earth.\"}"; done > "$W/ft.jsonl"
check "prepare JSON lines with the model's folder" "$TETRAD" prepare --input "$W/ft.jsonl" \
  --text-field text --out "$W/ft_data" --tokenizer "$W/hf" --val-fraction 0.1
check "data keeps tokenizer.json" cmp -s "$W/ft_data/tokenizer.json" "$FX/gpt2/tokenizer.json"

# 3. fine-tune from the folder on a 2-rank grid (tensor parallel X=2).
check "fine-tune on 2 ranks" "${MPIRUN[@]}" -n 2 "$TETRAD" train "${M[@]}" --set data.dir="$W/ft_data" \
  --set run.dir="$W/ft_run" --set run.init_from="$W/hf" --set train.max_steps=4 --grid 2,1,1,1 > "$W/ft.log" 2>&1
check "initialised from the folder" test -d "$W/ft_run/checkpoints"
# No [model] key: the model is the folder's (config.json), and the saved config says so.
check "fine-tune with the folder's model (no model keys)" "$TETRAD" train --set train.seq_len=32 \
  --set train.eval_interval=0 --set data.dir="$W/ft_data" --set run.dir="$W/ft_run2" \
  --set run.init_from="$W/hf" --set train.max_steps=2
check "saved config has the folder's vocabulary" grep -q "^vocab_size = 1000$" "$W/ft_run2/config.toml"
# A model key given means the config describes the model: a mismatch is refused by name.
expect_failure "a [model] that is not the folder's is refused" "config.json has norm_eps = 1e-05 but the config asks for 1e-06" \
  "$TETRAD" train --set model.name=tiny --set model.vocab_size=1000 --set model.norm_eps=1e-6 --set train.seq_len=32 --set train.eval_interval=0 --set data.dir="$W/ft_data" \
  --set run.dir="$W/ft_run3" --set run.init_from="$W/hf" --set train.max_steps=1
# Data made with another tokenizer is refused for this model.
"$TETRAD" prepare --input "$W/ft.jsonl" --out "$W/other_data" --tokenizer "$FX/sp" > /dev/null 2>&1
expect_failure "other tokenizer refused" "prepare the data with --tokenizer" "$TETRAD" train "${M[@]}" \
  --set data.dir="$W/other_data" --set run.dir="$W/bad_run" --set run.init_from="$W/hf" --set train.max_steps=1

# 4. export; the folder is complete and reads back.
check "export the fine-tuned model" "$TETRAD" export --model "$W/ft_run" --out "$W/hf_ft"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  check "exported folder has $f" test -f "$W/hf_ft/$f"
done
check "exported tokenizer is the model's" cmp -s "$W/hf_ft/tokenizer.json" "$FX/gpt2/tokenizer.json"
check "exported tokenizer_config is the model's" cmp -s "$W/hf_ft/tokenizer_config.json" "$FX/gpt2/tokenizer_config.json"
check "exported config.json has eos" grep -q '"eos_token_id": 0' "$W/hf_ft/config.json"
"$TETRAD" tokenize --tokenizer "$W/hf_ft" < "$FX/kjv_sample.txt" > "$W/ids"
check "exported tokenizer encodes as the library" cmp -s "$W/ids" "$FX/lines/gpt2.kjv_sample.ids"
check "generate with the model's tokenizer" "$TETRAD" generate --model "$W/hf_ft" --prompt "Blessed are" --max-new 5
check "eval with the model's tokenizer" "$TETRAD" eval --model "$W/hf_ft" --data "$W/ft_data" --seq-len 32 --batches 1
[ $fails -eq 0 ] && echo "finetune_cli: all passed" || echo "finetune_cli: $fails failed"
exit $((fails > 0))
