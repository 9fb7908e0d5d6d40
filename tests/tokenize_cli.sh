#!/usr/bin/env bash
# `tetrad tokenize` against the ids Hugging Face `tokenizers` and `sentencepiece` gave for the same
# lines (tests/fixtures/tokenizers/lines, made by make_fixtures.py), and `--decode` against their
# decode; bad input fails with a message naming the line.
set -uo pipefail
TETRAD=$1
FX=$(cd "$(dirname "$0")/fixtures/tokenizers" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0 compared=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
for name in gpt2 llama3 nfc sp; do
  tok="$FX/$name"  # the folder: tokenizer.json or tokenizer.model found in it
  for input in kjv_sample stress empty; do
    "$TETRAD" tokenize --tokenizer "$tok" < "$FX/$input.txt" > "$W/ids" 2> "$W/err" || cat "$W/err"
    check "$name $input ids" cmp -s "$W/ids" "$FX/lines/$name.$input.ids"
    "$TETRAD" tokenize --tokenizer "$tok" --decode < "$W/ids" > "$W/text" 2> "$W/err" || cat "$W/err"
    check "$name $input decode" cmp -s "$W/text" "$FX/lines/$name.$input.decoded"
    compared=$((compared + $(wc -w < "$FX/lines/$name.$input.ids")))
  done
done
echo "compared $compared token ids"
check "token ids compared" test "$compared" -gt 7000
out=$(printf '1 2\n3 x\n' | "$TETRAD" tokenize --tokenizer "$FX/gpt2/tokenizer.json" --decode 2>&1); rc=$?
check "bad id names its line" bash -c "[ $rc -eq 1 ] && grep -q 'line 2' <<<'$out'"
out=$("$TETRAD" tokenize --tokenizer "$W/none.json" < /dev/null 2>&1); rc=$?
check "missing tokenizer" bash -c "[ $rc -eq 1 ] && grep -q 'does not exist' <<<'$out'"
echo '{"model": {"type": "Unigram", "vocab": []}}' > "$W/tokenizer.json"
out=$("$TETRAD" tokenize --tokenizer "$W/tokenizer.json" < /dev/null 2>&1); rc=$?
check "unigram refused by name" bash -c "[ $rc -eq 1 ] && grep -q 'Unigram' <<<'$out'"
[ $fails -eq 0 ] && echo "tokenize_cli: all passed" || echo "tokenize_cli: $fails failed"
exit $((fails > 0))
