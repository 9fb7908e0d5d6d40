#!/usr/bin/env bash
# The layering check (tests/check_layering.cpp) must catch what it exists to catch: on a copy of
# src/ it passes as the tree is, then fails naming the file and the edge for a planted upward
# include (core including train), a planted sideways include (comm including data) and a planted
# include circle (two model headers including each other), and each failure goes away with the
# plant. Usage: layering_planted.sh CHECK_LAYERING_BINARY SRC_DIR
set -u
check=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cp -r "$src" "$work/src"
"$check" "$work/src" > "$work/clean.txt" || { cat "$work/clean.txt"; fail "the unplanted copy of src/ does not pass"; }

# expect_caught NAME FILE LINE_TO_ADD PATTERN: plant, expect exit 1 and PATTERN in the output,
# remove the plant, expect a pass again.
expect_caught() {
  local name=$1 file=$2 line=$3 pattern=$4
  cp "$work/src/$file" "$work/saved"
  printf '%s\n' "$line" >> "$work/src/$file"
  "$check" "$work/src" > "$work/$name.txt"
  local rc=$?
  if [ "$rc" -ne 1 ]; then fail "$name: exit $rc, expected 1"; cat "$work/$name.txt"; fi
  if ! grep -qF -- "$pattern" "$work/$name.txt"; then
    fail "$name: output lacks \"$pattern\""; cat "$work/$name.txt"
  else
    echo "caught $name: $(grep -F -- "$pattern" "$work/$name.txt")"
  fi
  cp "$work/saved" "$work/src/$file"
  "$check" "$work/src" > /dev/null || fail "$name: still failing after the plant was removed"
}

expect_caught upward tetrad/core/error.cpp '#include "tetrad/train/trainer.hpp"' \
  'upward include: tetrad/core/error.cpp:'
expect_caught upward_from_backend tetrad/backend/cpu/ops.cpp '#include "tetrad/parallel/grid.hpp"' \
  '(backend, level 1, may not include parallel, level 3)'
expect_caught sideways tetrad/comm/communicator.cpp '#include "tetrad/data/shards.hpp"' \
  'sideways include: tetrad/comm/communicator.cpp:'
expect_caught unrooted tetrad/model/params.cpp '#include "model_config.hpp"' \
  'unrooted include: tetrad/model/params.cpp:'

# A circle needs two plants: model/params.hpp already includes model_config.hpp; make
# model_config.hpp include params.hpp back.
cp "$work/src/tetrad/model/model_config.hpp" "$work/saved_mc"
printf '%s\n' '#include "tetrad/model/params.hpp"' >> "$work/src/tetrad/model/model_config.hpp"
"$check" "$work/src" > "$work/circle.txt"
rc=$?
[ "$rc" -eq 1 ] || fail "circle: exit $rc, expected 1"
if grep -qF 'include circle among 2 modules (tetrad/model/model_config, tetrad/model/params)' "$work/circle.txt"; then
  echo "caught circle: $(grep '^include circle' "$work/circle.txt")"
else
  fail "circle: not reported"; cat "$work/circle.txt"
fi
cp "$work/saved_mc" "$work/src/tetrad/model/model_config.hpp"

# A folder with no level is refused, not silently skipped.
mkdir -p "$work/src/tetrad/extra"
printf '%s\n' '#include "tetrad/core/error.hpp"' > "$work/src/tetrad/extra/thing.cpp"
"$check" "$work/src" > "$work/unplaced.txt"
rc=$?
[ "$rc" -eq 1 ] || fail "unplaced folder: exit $rc, expected 1"
grep -q 'unplaced folder: tetrad/extra/thing.cpp' "$work/unplaced.txt" || { fail "unplaced folder: not reported"; cat "$work/unplaced.txt"; }

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "the layering check catches every planted problem"
