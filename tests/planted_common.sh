# What the planted-problem tests of the source checks share (tests/layering_planted.sh,
# tests/sizes_planted.sh; sourced, not run): a copy of src/ in a scratch folder that the check
# must pass as it is, expect_caught to plant a problem and see it caught, and the verdict.
# Usage, in the sourcing script: source planted_common.sh CHECK_BINARY SRC_DIR
set -u
check=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cp -r "$src" "$work/src"
"$check" "$work/src" > "$work/clean.txt" || { cat "$work/clean.txt"; fail "the unplanted copy of src/ does not pass"; }

# caught NAME PATTERN [GREP_MODE]: the check on the copy as planted now must exit 1 with PATTERN
# in its output (GREP_MODE -F, the default: a fixed string; -G: a regular expression).
caught() {
  local name=$1 pattern=$2 mode=${3:--F}
  "$check" "$work/src" > "$work/$name.txt"
  local rc=$?
  if [ "$rc" -ne 1 ]; then fail "$name: exit $rc, expected 1"; cat "$work/$name.txt"; fi
  if ! grep -q "$mode" -- "$pattern" "$work/$name.txt"; then
    fail "$name: output lacks \"$pattern\""; cat "$work/$name.txt"
  else
    echo "caught $name: $(grep -m1 "$mode" -- "$pattern" "$work/$name.txt")"
  fi
}

# expect_caught NAME FILE PATTERN (the plant's text on stdin): append it to FILE (relative to
# src/), expect it caught, restore FILE, expect a pass again.
expect_caught() {
  local name=$1 file=$2 pattern=$3
  cp "$work/src/$file" "$work/saved"
  cat >> "$work/src/$file"
  caught "$name" "$pattern"
  cp "$work/saved" "$work/src/$file"
  "$check" "$work/src" > /dev/null || fail "$name: still failing after the plant was removed"
}

# finish VERDICT: exit 1 naming how many checks failed, else print VERDICT.
finish() {
  if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
  echo "$1"
}
