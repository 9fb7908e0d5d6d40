#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md, "The prepared check"): one command for a lent GPU machine,
# well under 10 minutes, everything it prints also in $OUT/gpu-check.log, a short table last.
#
#   1. nvidia-smi; the measured bf16 / fp32 GEMM ceilings and copy bandwidth (CudaKernels.Ceilings)
#   2. the CUDA kernels against double references (test_cuda_kernels) and the seam's backend
#      conformance suite on the CUDA backend (test_backend_conformance, *cuda*)
#   3. the tiny model 20 steps on the GPU against the CPU (test_gpu_model), and on every 2-rank
#      grid with both ranks on the one GPU through the MPI communicator (test_device_model_mpi)
#   4. 2 ranks on the one GPU through MPI, NCCL on one-rank groups (test_gpu_comm_mpi); the
#      communication conformance suite on NCCL with one rank (test_comm_conformance); tetrad
#      train with train.comm = nccl on one rank against the CPU (tests/comm_cli.sh gpu)
#   5. benchmarks: the ops at gpt2-124m's and llama-1b's shapes (CudaBench.ModelShapes: GEMM rates
#      per layer kind and pass, attention, cross-entropy), and the training benchmark
#      (tetrad bench --device cuda: tokens/s, MFU, time split) once the model runs on the backend
#
# Binaries: from .gpu-bundle/bundle.tar.xz (scripts/gpu-bundle.sh, built where nvcc is) or, if
# there is none, from build-gpu/. A step whose binary is not there is NOT BUILT; a GPU test that
# skips is SKIPPED; both make the script exit non-zero, as does the absence of a GPU (a skipped
# GPU test is not a passed one). Exit 0 only when every step passed.
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
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)

declare -a ROWS
row() { ROWS+=("$(printf '%-28s %-9s %s' "$1" "$2" "$3")"); }
elapsed() { echo $(( $(date +%s) - START )); }

# ---- the binaries and their libraries ----
if [ -f .gpu-bundle/bundle.tar.xz ]; then
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

# ---- 1. the device ----
echo "== nvidia-smi"
if ! nvidia-smi; then
  echo "gpu-check: no GPU here (nvidia-smi failed): nothing was checked"
  row "device" "NO GPU" "nvidia-smi failed"
  printf '%s\n' "${ROWS[@]}"
  exit 2
fi
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
row "device" "found" "$DEVICE"

# Runs a GoogleTest binary; the row says PASS only when it exited 0 with no test skipped.
gtest_step() {  # label timeout binary [args...]
  local label=$1 t=$2 bin=$3; shift 3
  local path; path=$(findbin "$bin")
  if [ -z "$path" ]; then row "$label" "NOT BUILT" "$bin missing"; return; fi
  echo "== $label: $bin $*  ($(elapsed) s in)"
  local f=$OUT/$bin.txt
  timeout "$t" "$path" "$@" 2>&1 | tee "$f"
  local rc=${PIPESTATUS[0]}
  local passed skipped failed
  passed=$(grep -Eo '\[  PASSED  \] [0-9]+' "$f" | grep -Eo '[0-9]+$' | tail -1)
  skipped=$(grep -Eo '\[  SKIPPED \] [0-9]+ test' "$f" | grep -Eo '[0-9]+' | tail -1)
  failed=$(grep -Eo '\[  FAILED  \] [0-9]+ test' "$f" | grep -Eo '[0-9]+' | tail -1)
  if [ "$rc" = 124 ]; then row "$label" "TIMEOUT" "after $t s"
  elif [ "$rc" != 0 ]; then row "$label" "FAIL" "rc $rc, ${failed:-?} failed, ${passed:-0} passed"
  elif [ -n "$skipped" ]; then row "$label" "SKIPPED" "$skipped skipped, ${passed:-0} passed"
  elif [ -z "$passed" ] || [ "$passed" = 0 ]; then row "$label" "EMPTY" "no test ran"
  else row "$label" "PASS" "$passed tests"; fi
}

echo "== ceilings"
gtest_step "ceilings" 120 test_cuda_kernels --gtest_filter='CudaCeilings.*'
grep '^ceiling' "$OUT/test_cuda_kernels.txt" 2>/dev/null | while read -r _ k v; do echo "  $k = $v"; done
CEIL=$(grep '^ceiling gemm_bf16_tflops' "$OUT/test_cuda_kernels.txt" 2>/dev/null | awk '{print $3}')
cp "$OUT/test_cuda_kernels.txt" "$OUT/ceilings.txt" 2>/dev/null

# ---- 2. kernels and conformance ----
gtest_step "kernels vs double" 180 test_cuda_kernels --gtest_filter='CudaKernels.*'
gtest_step "conformance (cuda)" 180 test_backend_conformance --gtest_filter='*cuda*'

# Op benchmarks on the models' shapes: GEMM rates per layer kind, attention, cross-entropy.
gtest_step "op bench (model shapes)" 240 test_cuda_kernels --gtest_filter='CudaBench.*'
cp "$OUT/test_cuda_kernels.txt" "$OUT/op-bench.txt" 2>/dev/null
while read -r line; do
  set -- $line
  row "ops $2" "measured" "$(echo "$line" | sed -E 's/^bench [^ ]+ summary //' | cut -c1-110)"
done < <(grep '^bench .* summary' "$OUT/op-bench.txt" 2>/dev/null)

# ---- 3. the tiny model, GPU against CPU ----
# The same harness the cpu-strict stand-in passes bit for bit in every CPU build
# (tests/device_model_harness.hpp; DeviceModel.*, DeviceModelMpi.* on cpu-strict).
gtest_step "tiny model 20 steps" 180 test_gpu_model
dm=$(findbin test_device_model_mpi)
if [ -z "$dm" ]; then row "model 2 ranks, 1 GPU (MPI)" "NOT BUILT" "test_device_model_mpi missing"
else
  echo "== the model on 2 ranks sharing the GPU, MPI staging ($(elapsed) s in)"
  timeout 150 mpirun --allow-run-as-root --oversubscribe -n 2 -x LD_LIBRARY_PATH -x OPAL_PREFIX \
    -x OMP_NUM_THREADS "$dm" --gtest_filter='*Cuda*' 2>&1 | tee "$OUT/test_device_model_mpi.txt"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then row "model 2 ranks, 1 GPU (MPI)" "FAIL" "rc $rc"
  elif grep -q 'SKIPPED' "$OUT/test_device_model_mpi.txt"; then
    row "model 2 ranks, 1 GPU (MPI)" "SKIPPED" "$(grep -m1 -A1 Skipped "$OUT/test_device_model_mpi.txt" | tail -1 | cut -c1-70)"
  else row "model 2 ranks, 1 GPU (MPI)" "PASS" "every 2-rank grid within rounding of the CPU"; fi
fi

# ---- 4. ranks: MPI on one GPU, NCCL on one-rank groups ----
mpi=$(findbin test_gpu_comm_mpi)
if [ -z "$mpi" ]; then row "2 ranks (MPI) + NCCL" "NOT BUILT" "test_gpu_comm_mpi missing"
else
  echo "== 2 ranks on one GPU ($(elapsed) s in)"
  timeout 120 mpirun --allow-run-as-root --oversubscribe -n 2 -x LD_LIBRARY_PATH -x OPAL_PREFIX \
    "$mpi" 2>&1 | tee "$OUT/test_gpu_comm_mpi.txt"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then row "2 ranks (MPI) + NCCL" "FAIL" "rc $rc"
  elif grep -q 'SKIPPED' "$OUT/test_gpu_comm_mpi.txt"; then
    row "2 ranks (MPI) + NCCL" "PASS*" "$(grep -c '\[       OK \]' "$OUT/test_gpu_comm_mpi.txt") ok; skips: $(grep -A1 Skipped "$OUT/test_gpu_comm_mpi.txt" | tail -1 | cut -c1-60)"
  else row "2 ranks (MPI) + NCCL" "PASS" "$(grep -c '\[       OK \]' "$OUT/test_gpu_comm_mpi.txt") tests"; fi
fi

# ---- 4b. the communication conformance suite on NCCL (one rank: one GPU) ----
conf=$(findbin test_comm_conformance)
if [ -z "$conf" ]; then row "comm conformance (nccl, 1 rank)" "NOT BUILT" "test_comm_conformance missing"
else
  echo "== communication conformance on NCCL, one rank ($(elapsed) s in)"
  timeout 120 mpirun --allow-run-as-root --oversubscribe -n 1 -x LD_LIBRARY_PATH -x OPAL_PREFIX \
    "$conf" --gtest_filter='*/nccl' 2>&1 | tee "$OUT/test_comm_conformance.txt"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then row "comm conformance (nccl, 1 rank)" "FAIL" "rc $rc"
  elif grep -q "cannot run here" "$OUT/test_comm_conformance.txt"; then
    row "comm conformance (nccl, 1 rank)" "SKIPPED" "$(grep -m1 'cannot run here' "$OUT/test_comm_conformance.txt" | cut -c1-80)"
  else row "comm conformance (nccl, 1 rank)" "PASS" "$(grep -c '\[       OK \]' "$OUT/test_comm_conformance.txt") ok, $(grep -c '\[  SKIPPED \]' "$OUT/test_comm_conformance.txt") need 2 ranks"; fi
fi

# ---- 4c. tetrad train with train.comm = nccl (one rank: NCCL groups of one GPU) vs the CPU ----
tetrad=$(findbin tetrad)
if [ -z "$tetrad" ]; then row "train comm=nccl vs cpu" "NOT BUILT" "tetrad missing"
else
  echo "== tetrad train --device cuda --set train.comm=nccl against --device cpu ($(elapsed) s in)"
  timeout 150 bash tests/comm_cli.sh "$tetrad" gpu 2>&1 | tee "$OUT/comm_cli_gpu.txt"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ]; then row "train comm=nccl vs cpu" "TIMEOUT" "after 150 s"
  elif [ "$rc" != 0 ]; then row "train comm=nccl vs cpu" "FAIL" "rc $rc, $(grep -c '^FAIL' "$OUT/comm_cli_gpu.txt") failed"
  elif grep -q '^SKIPPED' "$OUT/comm_cli_gpu.txt"; then
    row "train comm=nccl vs cpu" "SKIPPED" "$(grep -m1 '^SKIPPED' "$OUT/comm_cli_gpu.txt" | cut -c1-70)"
  else row "train comm=nccl vs cpu" "PASS" "$(grep -c '^ok' "$OUT/comm_cli_gpu.txt") checks, losses within 1e-4"; fi
fi

# ---- 5. benchmarks ----
steps=10
[ "$QUICK" = 1 ] && steps=3
if [ -z "$tetrad" ]; then row "bench" "NOT BUILT" "tetrad missing"
elif ! "$tetrad" bench --help 2>&1 | grep -q -- '--device'; then
  row "bench gpt2-124m / llama-1b" "NOT BUILT" "tetrad bench has no --device (model not on the backend yet)"
else
  for spec in "gpt2-124m 16 1024" "llama-1b 8 2048"; do
    set -- $spec
    echo "== bench $1 (batch $2, seq $3, bf16) ($(elapsed) s in)"
    timeout 200 "$tetrad" bench --device cuda --configs "$1" --batch "$2" --seq "$3" --precision bf16 \
      --steps "$steps" --json "$OUT/bench-$1.jsonl" 2>&1 | tee "$OUT/bench-$1.txt"
    rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then row "bench $1" "FAIL" "rc $rc"; continue; fi
    tps=$(grep -Eo '"tokens_per_s": *[0-9.]+' "$OUT/bench-$1.jsonl" | tail -1 | grep -Eo '[0-9.]+$')
    mfu=$(grep -Eo '"mfu": *[0-9.]+' "$OUT/bench-$1.jsonl" | tail -1 | grep -Eo '[0-9.]+$')
    row "bench $1" "ran" "tokens/s ${tps:-?}, MFU ${mfu:-?} (peak 989; GEMM ceiling ${CEIL:-?} TFLOP/s)"
  done
fi

echo
echo "== gpu-check: $DEVICE, $(elapsed) s; full log $LOG"
printf '%-28s %-9s %s\n' "step" "status" "detail"
printf '%s\n' "${ROWS[@]}"
for r in "${ROWS[@]}"; do
  case "$r" in *" PASS "*|*" PASS* "*|*" found "*|*" ran "*|*" measured "*) ;; *) exit 1 ;; esac
done
exit 0
