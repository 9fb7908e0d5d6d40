#!/usr/bin/env bash
# ConformanceCoversEveryOp: every entry of the op table (src/tetrad/backend/ops.hpp, OpTable) is
# called by the backend conformance suite (tests/test_backend_conformance.cpp, `ops_->NAME`), so
# a new op cannot reach a backend (and the GPU check, which runs the suite on cuda) untested.
# Usage: op_coverage.sh SOURCE_DIR
set -uo pipefail
SRC=${1:?source dir}
ops=$(sed -n '/^struct OpTable {/,/^};/p' "$SRC/src/tetrad/backend/ops.hpp" |
      grep -oE '\(\*[a-z0-9_]+\)' | tr -d '(*)')
[ -n "$ops" ] || { echo "FAIL no op found in OpTable (ops.hpp changed shape?)"; exit 1; }
missing=0
for op in $ops; do
  if grep -qE "ops_->$op\b" "$SRC/tests/test_backend_conformance.cpp"; then echo "ok   $op"
  else echo "FAIL $op: no call in tests/test_backend_conformance.cpp"; missing=$((missing + 1)); fi
done
echo "op_coverage: $(echo "$ops" | wc -w) ops, $missing not called by the conformance suite"
exit $((missing > 0))
