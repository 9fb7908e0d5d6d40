#!/usr/bin/env bash
# scripts/gpu-check.sh's own logic, without a GPU (GpuCheckScript): stand-ins for nvidia-smi and
# the test binaries (GPU_CHECK_BIN) drive it through
#   no GPU        exit 2, the table printed with every step NOT RUN
#   a hang        under one overall deadline (GPU_CHECK_DEADLINE): the hanging step TIMEOUT, the
#                 rest NOT RUN naming the deadline, the table printed, done within the deadline
#   a small card  CudaDevice.* fails: the card REFUSED by name, nothing else run
#   skips         the conformance suite's "[optional]" skips PASS (counted), any other SKIPPED
#   a signal      TERM to the script's process group mid-step: the step STOPPED, the table printed
# Usage: gpu_check_script.sh [SOURCE_DIR]
set -uo pipefail
SRC=${1:-$(cd "$(dirname "$0")/.." && pwd)}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
has() { grep -qE "$2" "$1" || { bad "$3: no line matching '$2' in:"; sed 's/^/     /' "$1" | tail -25; return 1; }; ok "$3"; }

mkdir -p "$W/smi-none" "$W/smi" "$W/bin"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed" >&2\nexit 9\n' > "$W/smi-none/nvidia-smi"
printf '#!/bin/sh\ncase "$*" in *query-gpu*) echo "NVIDIA H200";; *) echo "fake nvidia-smi";; esac\n' > "$W/smi/nvidia-smi"
chmod +x "$W/smi-none/nvidia-smi" "$W/smi/nvidia-smi"
# A GoogleTest stand-in: behaviour per --gtest_filter from the environment (FAKE_<suite>).
cat > "$W/bin/test_cuda_kernels" <<'SH'
#!/bin/bash
case "$*" in
  *CudaDevice*)
    if [ "${FAKE_CARD:-ok}" = small ]; then
      echo "card NVIDIA GeForce RTX 4090 (compute capability 8.9): 101376 bytes"
      echo "REFUSED: CUDA attention: head_dim 128 on the fp32 path needs 110848 bytes"
      echo "[  FAILED  ] 1 test, listed below:"; exit 1
    fi
    echo "card NVIDIA H200 (compute capability 9.0): 232448 bytes"; echo "[  PASSED  ] 1 test."; exit 0;;
  *CudaCeilings*) [ "${FAKE_CEILINGS:-ok}" = hang ] && exec sleep 1000
    echo "ceiling gemm_bf16_tflops 790.0"; echo "[  PASSED  ] 1 test."; exit 0;;
  *) echo "[  PASSED  ] 12 tests."; exit 0;;
esac
SH
cat > "$W/bin/test_backend_conformance" <<'SH'
#!/bin/bash
echo "[ RUN      ] Backends/Conformance.A/cuda"
echo "[optional] cuda:0 has no ce_grad_bf16 (Capabilities::bf16_loss_grad)"
echo "[  SKIPPED ] Backends/Conformance.A/cuda (0 ms)"
if [ "${FAKE_SKIP:-optional}" = device ]; then
  echo "backend 'cuda' is built but cannot run here: no device"
  echo "[  SKIPPED ] Backends/Conformance.B/cuda (0 ms)"
  echo "[  PASSED  ] 30 tests."; echo "[  SKIPPED ] 2 tests, listed below:"; exit 0
fi
echo "[optional] cuda:0 has no bf16 producers"
echo "[  PASSED  ] 30 tests."; echo "[  SKIPPED ] 2 tests, listed below:"; exit 0
SH
chmod +x "$W/bin/"*

check() {  # name env... -> runs the script, output in $W/NAME.out, exit status in $W/NAME.rc
  local name=$1; shift
  local t0; t0=$(date +%s)
  env OUT="$W/out-$name" GPU_CHECK_BIN="$W/bin" "$@" bash "$SRC/scripts/gpu-check.sh" > "$W/$name.out" 2>&1
  echo $? > "$W/$name.rc"
  echo $(( $(date +%s) - t0 )) > "$W/$name.s"
}

# 1. no GPU
check nogpu PATH="$W/smi-none:$PATH"
[ "$(cat "$W/nogpu.rc")" = 2 ] && ok "no GPU: exit 2" || bad "no GPU: exit $(cat "$W/nogpu.rc"), expected 2"
has "$W/nogpu.out" '^device +NO GPU' "no GPU: the device row"
has "$W/nogpu.out" '^kernels vs double +NOT RUN +no GPU' "no GPU: the steps NOT RUN"
has "$W/out-nogpu/gpu-check.log" '^step +status' "no GPU: the table in the log"

# 2. a hanging step under the deadline
check hang PATH="$W/smi:$PATH" FAKE_CEILINGS=hang GPU_CHECK_DEADLINE=14 GPU_CHECK_RESERVE=2 GPU_CHECK_MIN_STEP=3
[ "$(cat "$W/hang.rc")" = 1 ] && ok "hang: exit 1" || bad "hang: exit $(cat "$W/hang.rc"), expected 1"
[ "$(cat "$W/hang.s")" -le 16 ] && ok "hang: ended in $(cat "$W/hang.s") s (deadline 14)" ||
  bad "hang: took $(cat "$W/hang.s") s against a 14 s deadline"
has "$W/hang.out" '^card \(attention tiles\) +PASS +NVIDIA H200' "hang: the card passed"
has "$W/hang.out" '^ceilings +TIMEOUT' "hang: the hanging step TIMEOUT"
has "$W/hang.out" '^kernels vs double +NOT RUN +deadline' "hang: later steps NOT RUN (deadline)"
has "$W/hang.out" '^bench llama-1b +(NOT RUN|NOT BUILT)' "hang: the table ends with the last step"

# 3. a card too small for the attention tiles
check small PATH="$W/smi:$PATH" FAKE_CARD=small
[ "$(cat "$W/small.rc")" = 1 ] && ok "small card: exit 1" || bad "small card: exit $(cat "$W/small.rc")"
has "$W/small.out" '^card \(attention tiles\) +REFUSED +NVIDIA H200: CUDA attention: head_dim 128' "small card: REFUSED by name"
has "$W/small.out" '^ceilings +NOT RUN +the card was refused' "small card: nothing else ran"

# 4. skips: optional ops counted, anything else SKIPPED
check opt PATH="$W/smi:$PATH"
has "$W/opt.out" '^conformance \(cuda\) +PASS +30 tests; 2 optional ops' "optional skips: PASS"
check skip PATH="$W/smi:$PATH" FAKE_SKIP=device
has "$W/skip.out" '^conformance \(cuda\) +SKIPPED +2 skipped \(1 optional' "a device skip: SKIPPED"

# 5. a signal to the process group mid-step
# setsid: the script leads its own process group (its pid, written first, is the group's id).
( env OUT="$W/out-sig" GPU_CHECK_BIN="$W/bin" PATH="$W/smi:$PATH" FAKE_CEILINGS=hang \
    setsid bash -c 'echo $$ > "$0"; exec bash "$1"' "$W/sig.pid" "$SRC/scripts/gpu-check.sh" \
    > "$W/sig.out" 2>&1; echo $? > "$W/sig.rc" ) &
for _ in $(seq 50); do grep -q 'gpu-check.sh' /proc/"$(cat "$W/sig.pid" 2>/dev/null)"/cmdline 2>/dev/null &&
  [ -f "$W/out-sig/ceilings.txt" ] && break; sleep 0.2; done
sleep 1
pgid=$(cat "$W/sig.pid" 2>/dev/null)
if [ -n "$pgid" ]; then kill -TERM -- "-$pgid"; else bad "signal: the script's pid was not written"; fi
wait
[ "$(cat "$W/sig.rc" 2>/dev/null)" = 1 ] && ok "signal: exit 1" || bad "signal: exit $(cat "$W/sig.rc" 2>/dev/null)"
has "$W/sig.out" '^ceilings +STOPPED +by a signal' "signal: the running step STOPPED"
has "$W/sig.out" '^kernels vs double +NOT RUN +a signal stopped' "signal: the rest NOT RUN"

[ "$fails" = 0 ] && echo "gpu_check_script: all passed" || echo "gpu_check_script: $fails failed"
exit $((fails > 0))
