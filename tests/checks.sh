# The check helpers of shell tests that count their failures (sourced): check NAME COMMAND...
# passes when COMMAND succeeds; expect_error NAME SUBSTRING COMMAND... when COMMAND exits with
# status 1 and its output names SUBSTRING; expect_failure likewise for any non-zero status (a
# command under mpirun). Each prints "ok   NAME" or "FAIL NAME ..." and counts failures in $fails.
fails=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
expect_error() { expect_exit 1 "$@"; }
expect_failure() { expect_exit nonzero "$@"; }
expect_exit() {  # expect_exit 1|nonzero NAME SUBSTRING COMMAND...
  local want=$1 name=$2 sub=$3; shift 3
  local out rc status_ok=0
  out=$("$@" 2>&1); rc=$?
  if [ "$want" = nonzero ]; then [ $rc -ne 0 ] && status_ok=1; else [ $rc -eq "$want" ] && status_ok=1; fi
  if [ $status_ok -eq 1 ] && grep -qF -- "$sub" <<<"$out"; then echo "ok   $name"
  else echo "FAIL $name (rc=$rc): $out"; fails=$((fails + 1)); fi
}
