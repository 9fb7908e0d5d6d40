#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md, "The prepared check"): one command for a lent GPU machine,
# under ONE overall deadline (GPU_CHECK_DEADLINE seconds, default 500: a device call may run 540),
# everything it prints also in $OUT/gpu-check.log, and the summary table printed last whatever
# happens (a step over its time, the deadline, a signal): a step that did not run says NOT RUN
# and why.
#
#   0. the card: nvidia-smi, then CudaDevice.* (its blocks must hold every attention kernel's
#      tiles: an sm_86 / sm_89 card is REFUSED by name and nothing else runs)
#   1. the measured bf16 / tf32 / fp32 GEMM ceilings and copy bandwidth (CudaCeilings.*)
#   2. the CUDA kernels against double references (test_cuda_kernels) and the seam's backend
#      conformance suite on the CUDA backend (test_backend_conformance, *cuda*: every op of the
#      table against a double reference on fresh random inputs); the backend's figures the trainer
#      reads (test_gpu_memory: free memory, the MFU baseline)
#   3. the tiny model 20 steps on the GPU against the CPU (test_gpu_model), and on every 2-rank
#      grid with both ranks on the one GPU through the MPI communicator (test_device_model_mpi)
#   4. 2 ranks on the one GPU through MPI, NCCL on one-rank groups (test_gpu_comm_mpi); the
#      communication conformance suite on NCCL with one rank (test_comm_conformance); tetrad
#      train with train.comm = nccl on one rank against the CPU (tests/comm_cli.sh gpu)
#   5. benchmarks: the ops at gpt2-124m's and llama-1b's shapes (CudaBench.ModelShapes: GEMM rates
#      per layer kind and pass, attention, cross-entropy), and the training benchmark
#      (tetrad bench --device cuda: tokens/s, MFU, time split)
# Correctness first, benchmarks last: the deadline cuts the least important steps. Each step runs
# under the smaller of its own budget and what is left of the deadline (less a reserve for the
# table); a step that cannot get GPU_CHECK_MIN_STEP seconds is NOT RUN.
#
# Binaries: from .gpu-bundle/bundle.tar.xz (scripts/gpu-bundle.sh, built where nvcc is) or, if
# there is none, from build-gpu/ (GPU_CHECK_BIN=DIR names another folder: the script's own test,
# tests/gpu_check_script.sh, uses stand-ins). A step whose binary is not there is NOT BUILT; a GPU
# test that skips is SKIPPED, except the conformance suite's skips of optional ops the backend
# does not have (reasons starting "[optional]"), which the row counts; NOT BUILT, SKIPPED, NOT
# RUN, TIMEOUT, REFUSED and FAIL make the script exit 1, no GPU exits 2 (a skipped GPU test is
# not a passed one). Exit 0 only when every step passed.
#
# Usage: OUT=/some/dir bash scripts/gpu-check.sh [--quick]   (--quick: benchmarks with 3 steps)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
LOG=$OUT/gpu-check.log
: > "$LOG"
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
# tee ignores INT and TERM, so that the table still reaches the log and the caller when the
# script's process group is signalled.
exec > >(trap '' INT TERM; exec tee -a "$LOG") 2>&1
START=$(date +%s)
DEADLINE=${GPU_CHECK_DEADLINE:-500}
RESERVE=${GPU_CHECK_RESERVE:-10}  # seconds kept for the table after the last step
MIN_STEP=${GPU_CHECK_MIN_STEP:-15}
DEVICE="no device"

# Every step, in order, so that the table names the ones that never ran.
STEPS=("device" "card (attention tiles)" "ceilings" "kernels vs double" "conformance (cuda)"
       "device figures" "tiny model 20 steps" "model 2 ranks, 1 GPU (MPI)" "2 ranks (MPI) + NCCL"
       "comm conformance (nccl, 1 rank)" "train comm=nccl vs cpu" "op bench (model shapes)"
       "bench gpt2-124m" "bench llama-1b")
declare -A STATUS DETAIL
row() { STATUS[$1]=$2; DETAIL[$1]=$3; }
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( DEADLINE - RESERVE - $(elapsed) )); }
STOPPED=""  # why the remaining steps do not run (deadline, refused card, no GPU, a signal)

TABLE_DONE=0
print_table() {
  [ "$TABLE_DONE" = 1 ] && return
  TABLE_DONE=1
  echo
  echo "== gpu-check: $DEVICE, $(elapsed) s of a $DEADLINE s deadline; full log $LOG"
  printf '%-32s %-9s %s\n' "step" "status" "detail"
  local st
  for st in "${STEPS[@]}"; do
    if [ -n "${STATUS[$st]:-}" ]; then
      printf '%-32s %-9s %s\n' "$st" "${STATUS[$st]}" "${DETAIL[$st]}"
    else
      printf '%-32s %-9s %s\n' "$st" "NOT RUN" "${STOPPED:-not reached}"
    fi
  done
}
verdict() {  # 0: every step passed (or measured); 1 otherwise
  local st
  for st in "${STEPS[@]}"; do
    case "${STATUS[$st]:-NOT RUN}" in PASS|found|ran|measured) ;; *) return 1 ;; esac
  done
  return 0
}
finish() {  # the table, always; the exit status from the rows
  local rc=$?
  print_table
  if [ -n "${NO_GPU:-}" ]; then exit 2; fi
  verdict && exit 0
  exit 1
}
CURRENT=""  # the step running now
CHILD=""    # its process (timeout ...)
on_signal() {
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null
  [ -n "$CURRENT" ] && row "$CURRENT" "STOPPED" "by a signal at $(elapsed) s"
  STOPPED="a signal stopped the check at $(elapsed) s"
  exit 1
}
trap finish EXIT
trap on_signal INT TERM
# Runs a command under timeout in the background and waits for it (a trapped signal interrupts
# the wait at once; a foreground command would delay the trap until it ended); its output goes
# to the file, then to the log. Sets RC.
run_logged() {  # label timeout file command...
  local label=$1 t=$2 f=$3; shift 3
  CURRENT=$label
  timeout "$t" "$@" > "$f" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  RC=$?
  CHILD=""
  CURRENT=""
  cat "$f"
}
# Whether a step may start, and its timeout T: the smaller of its budget and what is left.
budget() {  # label seconds -> sets T, or returns 1 having marked the step NOT RUN
  local l; l=$(left)
  if [ -n "$STOPPED" ]; then row "$1" "NOT RUN" "$STOPPED"; return 1; fi
  if [ "$l" -lt "$MIN_STEP" ]; then
    row "$1" "NOT RUN" "deadline: $(elapsed) s of $DEADLINE s gone"
    return 1
  fi
  T=$2
  [ "$l" -lt "$T" ] && T=$l
  return 0
}

# ---- the binaries and their libraries ----
if [ -n "${GPU_CHECK_BIN:-}" ]; then
  BIN=$GPU_CHECK_BIN
  echo "binaries: $BIN (GPU_CHECK_BIN)"
elif [ -f .gpu-bundle/bundle.tar.xz ]; then
  B=/tmp/tetrad-gpu
  rm -rf "$B" && mkdir -p "$B"
  tar -xJf .gpu-bundle/bundle.tar.xz -C "$B"
  BIN=$B/bin
  export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX=$B/ompi/usr PATH="$B/ompi/usr/bin:$PATH"
  echo "binaries: bundle of commit $(cat "$B/COMMIT")"
elif [ -d build-gpu ]; then
  BIN=$ROOT/build-gpu/tests
  echo "binaries: build-gpu/ (no bundle)"
else
  BIN=/nonexistent
  echo "binaries: none (run scripts/gpu-bundle.sh where nvcc is)"
fi
findbin() {  # the path of a binary of the bundle or build, or nothing
  local d
  for d in "$BIN" "$ROOT/build-gpu" "$ROOT/build-gpu/tests" "$ROOT/build-gpu/tests/gpu"; do
    [ -x "$d/$1" ] && { echo "$d/$1"; return; }
  done
}
# CUDA's libraries from the Python wheels of the lent machine (nvidia-cublas, nvidia-nccl-cu13).
for py in python3 /opt/torch/.venv/bin/python3; do
  site=$($py -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) || continue
  for s in $site; do
    for d in "$s"/nvidia/*/lib "$s"/nvidia/cu13/lib; do
      [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
    done
  done
done
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

# ---- 0. the device and the card ----
echo "== nvidia-smi"
if ! nvidia-smi; then
  echo "gpu-check: no GPU here (nvidia-smi failed): nothing was checked"
  row "device" "NO GPU" "nvidia-smi failed"
  STOPPED="no GPU"
  NO_GPU=1
  exit 2
fi
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
row "device" "found" "$DEVICE"

slug() { echo "$1" | tr -c 'A-Za-z0-9\n' '_'; }
# Runs a GoogleTest binary under the step's budget; the row says PASS only when it exited 0 with
# no test skipped, or with only the conformance suite's "[optional]" skips (counted in the row).
gtest_step() {  # label budget binary [args...]
  local label=$1 want=$2 bin=$3; shift 3
  local path; path=$(findbin "$bin")
  if [ -z "$path" ]; then row "$label" "NOT BUILT" "$bin missing"; return; fi
  budget "$label" "$want" || return
  local t=$T
  echo "== $label: $bin $*  ($(elapsed) s in, at most $t s)"
  local f; f=$OUT/$(slug "$label").txt
  run_logged "$label" "$t" "$f" "$path" "$@"
  local rc=$RC
  local passed skipped failed optional
  passed=$(grep -Eo '\[  PASSED  \] [0-9]+' "$f" | grep -Eo '[0-9]+$' | tail -1)
  skipped=$(grep -Eo '\[  SKIPPED \] [0-9]+ test' "$f" | grep -Eo '[0-9]+' | tail -1)
  failed=$(grep -Eo '\[  FAILED  \] [0-9]+ test' "$f" | grep -Eo '[0-9]+' | tail -1)
  optional=$(grep -c '^\[optional\]' "$f")
  if [ "$rc" = 124 ]; then row "$label" "TIMEOUT" "after $t s"
  elif [ "$rc" != 0 ]; then row "$label" "FAIL" "rc $rc, ${failed:-?} failed, ${passed:-0} passed"
  elif [ -n "$skipped" ] && [ "$skipped" != "$optional" ]; then
    row "$label" "SKIPPED" "$skipped skipped ($optional optional ops absent), ${passed:-0} passed"
  elif [ -z "$passed" ] || [ "$passed" = 0 ]; then row "$label" "EMPTY" "no test ran"
  elif [ -n "$skipped" ]; then row "$label" "PASS" "$passed tests; $skipped optional ops the backend lacks, skipped"
  else row "$label" "PASS" "$passed tests"; fi
}
# Runs a command (mpirun, a script) under the step's budget; sets RC and the step's output file F.
timed_step() {  # label budget command...
  local label=$1 want=$2; shift 2
  budget "$label" "$want" || return 1
  local t=$T
  echo "== $label ($(elapsed) s in, at most $t s)"
  F=$OUT/$(slug "$label").txt
  run_logged "$label" "$t" "$F" "$@"
  [ "$RC" = 124 ] && row "$label" "TIMEOUT" "after $t s"
  return 0
}

# The card: its blocks must hold the attention kernels' tiles (attention_tiles.hpp). A card that
# cannot is refused by name, and nothing else runs on it.
card="card (attention tiles)"
gtest_step "$card" 30 test_cuda_kernels --gtest_filter='CudaDevice.*'
if [ "${STATUS[$card]:-}" = FAIL ]; then
  why=$(grep -m1 -o 'REFUSED: .*' "$OUT/$(slug "$card").txt" | cut -c10-)
  row "$card" "REFUSED" "$DEVICE: ${why:-see the log}"
  STOPPED="the card was refused: $DEVICE"
elif [ "${STATUS[$card]:-}" = PASS ]; then
  row "$card" "PASS" "$(grep -m1 -o '^card .*' "$OUT/$(slug "$card").txt" | cut -c6-)"
fi

# ---- 1. ceilings ----
gtest_step "ceilings" 60 test_cuda_kernels --gtest_filter='CudaCeilings.*'
grep '^ceiling' "$OUT/ceilings.txt" 2>/dev/null | while read -r _ k v; do echo "  $k = $v"; done
CEIL=$(grep '^ceiling gemm_bf16_tflops' "$OUT/ceilings.txt" 2>/dev/null | awk '{print $3}')

# ---- 2. kernels, conformance, the backend's figures ----
gtest_step "kernels vs double" 90 test_cuda_kernels --gtest_filter='CudaKernels.*'
gtest_step "conformance (cuda)" 90 test_backend_conformance --gtest_filter='*cuda*'
gtest_step "device figures" 30 test_gpu_memory

# ---- 3. the tiny model, GPU against CPU ----
# The same harness the cpu-strict stand-in passes bit for bit in every CPU build
# (tests/device_model_harness.hpp; DeviceModel.*, DeviceModelMpi.* on cpu-strict).
gtest_step "tiny model 20 steps" 90 test_gpu_model
label="model 2 ranks, 1 GPU (MPI)"
dm=$(findbin test_device_model_mpi)
if [ -z "$dm" ]; then row "$label" "NOT BUILT" "test_device_model_mpi missing"
elif timed_step "$label" 60 mpirun --allow-run-as-root --oversubscribe -n 2 -x LD_LIBRARY_PATH \
       -x OPAL_PREFIX -x OMP_NUM_THREADS "$dm" --gtest_filter='*Cuda*' && [ "$RC" != 124 ]; then
  if [ "$RC" != 0 ]; then row "$label" "FAIL" "rc $RC"
  elif grep -q 'SKIPPED' "$F"; then
    row "$label" "SKIPPED" "$(grep -m1 -A1 Skipped "$F" | tail -1 | cut -c1-70)"
  else row "$label" "PASS" "every 2-rank grid within rounding of the CPU"; fi
fi

# ---- 4. ranks: MPI on one GPU, NCCL on one-rank groups ----
label="2 ranks (MPI) + NCCL"
mpi=$(findbin test_gpu_comm_mpi)
if [ -z "$mpi" ]; then row "$label" "NOT BUILT" "test_gpu_comm_mpi missing"
elif timed_step "$label" 45 mpirun --allow-run-as-root --oversubscribe -n 2 -x LD_LIBRARY_PATH \
       -x OPAL_PREFIX "$mpi" && [ "$RC" != 124 ]; then
  if [ "$RC" != 0 ]; then row "$label" "FAIL" "rc $RC"
  elif grep -q 'SKIPPED' "$F"; then
    row "$label" "SKIPPED" "$(grep -c '\[       OK \]' "$F") ok; skips: $(grep -A1 Skipped "$F" | tail -1 | cut -c1-60)"
  else row "$label" "PASS" "$(grep -c '\[       OK \]' "$F") tests"; fi
fi

# ---- 4b. the communication conformance suite on NCCL (one rank: one GPU) ----
label="comm conformance (nccl, 1 rank)"
conf=$(findbin test_comm_conformance)
if [ -z "$conf" ]; then row "$label" "NOT BUILT" "test_comm_conformance missing"
elif timed_step "$label" 45 mpirun --allow-run-as-root --oversubscribe -n 1 -x LD_LIBRARY_PATH \
       -x OPAL_PREFIX "$conf" --gtest_filter='*/nccl' && [ "$RC" != 124 ]; then
  if [ "$RC" != 0 ]; then row "$label" "FAIL" "rc $RC"
  elif grep -q "cannot run here" "$F"; then
    row "$label" "SKIPPED" "$(grep -m1 'cannot run here' "$F" | cut -c1-80)"
  else row "$label" "PASS" "$(grep -c '\[       OK \]' "$F") ok, $(grep -c '\[  SKIPPED \]' "$F") need 2 ranks"; fi
fi

# ---- 4c. tetrad train with train.comm = nccl (one rank: NCCL groups of one GPU) vs the CPU ----
label="train comm=nccl vs cpu"
tetrad=$(findbin tetrad)
if [ -z "$tetrad" ]; then row "$label" "NOT BUILT" "tetrad missing"
elif timed_step "$label" 60 bash tests/comm_cli.sh "$tetrad" gpu && [ "$RC" != 124 ]; then
  if [ "$RC" != 0 ]; then row "$label" "FAIL" "rc $RC, $(grep -c '^FAIL' "$F") failed"
  elif grep -q '^SKIPPED' "$F"; then row "$label" "SKIPPED" "$(grep -m1 '^SKIPPED' "$F" | cut -c1-70)"
  else row "$label" "PASS" "$(grep -c '^ok' "$F") checks, losses within 1e-4"; fi
fi

# ---- 5. benchmarks ----
# Op benchmarks on the models' shapes: GEMM rates per layer kind, attention, cross-entropy.
gtest_step "op bench (model shapes)" 90 test_cuda_kernels --gtest_filter='CudaBench.*'
[ "${STATUS[op bench (model shapes)]:-}" = PASS ] &&
  row "op bench (model shapes)" "measured" "summaries above the table"
steps=10
[ "$QUICK" = 1 ] && steps=3
for spec in "gpt2-124m 16 1024" "llama-1b 8 2048"; do
  set -- $spec
  label="bench $1"
  if [ -z "$tetrad" ]; then row "$label" "NOT BUILT" "tetrad missing"; continue; fi
  if ! "$tetrad" bench --help 2>&1 | grep -q -- '--device'; then
    row "$label" "NOT BUILT" "tetrad bench has no --device"; continue
  fi
  timed_step "$label" 60 "$tetrad" bench --device cuda --configs "$1" --batch "$2" --seq "$3" \
    --precision bf16 --steps "$steps" --json "$OUT/bench-$1.jsonl" || continue
  [ "$RC" = 124 ] && continue
  if [ "$RC" != 0 ]; then row "$label" "FAIL" "rc $RC"; continue; fi
  tps=$(grep -Eo '"tokens_per_s": *[0-9.]+' "$OUT/bench-$1.jsonl" | tail -1 | grep -Eo '[0-9.]+$')
  mfu=$(grep -Eo '"mfu": *[0-9.]+' "$OUT/bench-$1.jsonl" | tail -1 | grep -Eo '[0-9.]+$')
  row "$label" "ran" "tokens/s ${tps:-?}, MFU ${mfu:-?} (peak 989; GEMM ceiling ${CEIL:-?} TFLOP/s)"
done

# The op benchmarks' summaries, then the table (finish, on EXIT).
grep '^bench .* summary' "$OUT/op_bench__model_shapes_.txt" 2>/dev/null | sed 's/^/  /'
exit 0
