#!/usr/bin/env bash
# The size check (tests/check_sizes.cpp) must catch what it exists to catch: on a copy of src/ it
# passes as the tree is, then fails naming the function or file for a planted long function
# (src/ limit), a planted long function in train/ (its lower limit), a planted long file, and a
# known offender that has become short ("remove it from the list"); each failure goes away with
# the plant. Usage: sizes_planted.sh CHECK_SIZES_BINARY SRC_DIR
source "$(dirname "$0")/planted_common.sh" "$1" "$2"

# A function of N lines (opening and closing brace included), named NAME.
long_function() {
  local name=$1 n=$2
  echo "namespace planted { int $name(int x) {"
  for ((i = 0; i < n - 2; ++i)); do echo "  x += $i;  // { a brace in a comment does not count"; done
  echo "  return x; } }"
}

long_function planted_long 251 | expect_caught long_function tetrad/core/error.cpp \
  'too long: function planted::planted_long at tetrad/core/error.cpp:'
# 151 lines: within the src/ limit, over train/'s.
long_function planted_train 151 | expect_caught long_train_function tetrad/train/config.cpp \
  'too long: function planted::planted_train at tetrad/train/config.cpp:'
# The same 151 lines outside train/ pass.
cp "$work/src/tetrad/core/error.cpp" "$work/saved"
long_function planted_ok 151 >> "$work/src/tetrad/core/error.cpp"
"$check" "$work/src" > "$work/ok.txt" || { fail "a 151-line function outside train/ fails"; cat "$work/ok.txt"; }
cp "$work/saved" "$work/src/tetrad/core/error.cpp"
# A file over 900 lines (comments count: the limit is on lines).
for ((i = 0; i < 901; ++i)); do echo "// line $i"; done |
  expect_caught long_file tetrad/core/hash.cpp 'too long: file tetrad/core/hash.cpp: '

# A known offender that is short now must be taken off the list: empty its file.
known=$(grep -m1 '^known: ' "$work/clean.txt")
if [ -n "$known" ]; then
  file=$(echo "$known" | sed -n 's/^known: function .* at \([^:]*\):.*/\1/p; s/^known: file \([^:]*\):.*/\1/p')
  cp "$work/src/$file" "$work/saved"
  : > "$work/src/$file"
  caught stale "^stale: known offender .*$file.*remove it from the list" -G
  cp "$work/saved" "$work/src/$file"
else
  echo "no known offender left: the stale-entry case has nothing to plant"
fi

finish "the size check catches every planted problem"
