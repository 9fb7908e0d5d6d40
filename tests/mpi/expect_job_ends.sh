#!/usr/bin/env bash
# Usage: expect_job_ends.sh MAX_SECONDS [--expect TEXT] COMMAND...
# Passes when COMMAND (an mpirun job in which a rank dies) ends within MAX_SECONDS with a non-zero
# exit status (and, with --expect, its output contains TEXT); fails if it exits 0 or has to be
# killed (a hang).
set -u
max=$1
shift
expect=""
if [ "${1:-}" = "--expect" ]; then
  expect=$2
  shift 2
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start_ms=$(($(date +%s%N) / 1000000))
timeout -k 5 "$max" "$@" >"$log" 2>&1
rc=$?
elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
cat "$log"
echo "expect_job_ends: exit status $rc after $((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000))) s"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "expect_job_ends: FAIL: the job did not end within $max s (it hung)"
  exit 1
fi
if [ "$rc" -eq 0 ]; then
  echo "expect_job_ends: FAIL: the job exited 0 although a rank died"
  exit 1
fi
if [ -n "$expect" ] && ! grep -qF -- "$expect" "$log"; then
  echo "expect_job_ends: FAIL: the output does not contain \"$expect\""
  exit 1
fi
echo "expect_job_ends: OK: the job ended with a non-zero status"
exit 0
