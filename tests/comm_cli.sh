#!/usr/bin/env bash
# `train.comm` (auto | mpi | nccl: the model's communicator, config.hpp), through the CLI's --set.
#   comm_cli.sh TETRAD cpu  (CommCli): on the CPU, train.comm = nccl and a misspelt value are
#     refused before any step, naming the setting, the value and what is needed; auto on two CPU
#     ranks picks mpi and says so in the log, and trains like train.comm = mpi (bit-identical).
#   comm_cli.sh TETRAD gpu  (GpuTrainNccl, CUDA builds with NCCL): the tiny model trained on one
#     GPU with train.comm = nccl (NCCL groups of one rank; NCCL refuses two ranks on one GPU)
#     against the same steps on the CPU: fp32 losses within 1e-4 relative. Without a GPU it
#     prints "SKIPPED: <reason>" (CTest reports it as skipped, never as passed).
source "$(dirname "${BASH_SOURCE[0]}")/cli_common.sh" "$1"
mode=${2:-cpu}
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
N=8
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=$N
   --set train.eval_interval=0 --set train.log_interval=100000 --set train.checkpoint_interval=0
   --set train.precision=fp32)

if [ "$mode" = gpu ]; then
  out=$("$TETRAD" train "${S[@]}" --device cuda --set train.comm=nccl --set run.dir="$W/nccl" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -Eq 'backend "cuda" cannot run here|unknown backend "cuda"|no CUDA|cudaGetDeviceCount' <<<"$out"; then
    echo "SKIPPED: no GPU: $(grep -Eo 'backend "cuda".*|cudaGetDeviceCount.*' <<<"$out" | head -1 | cut -c1-200)"
    exit 0
  fi
  [ $rc -eq 0 ] || { echo "$out" | tail -20; bad "train --device cuda --set train.comm=nccl (status $rc)"; exit 1; }
  if grep -q "^comm: nccl [0-9]" <<<"$out"; then ok "log: $(grep '^comm:' <<<"$out")"
  else bad "no 'comm: nccl' line in the log"; grep -i "comm" <<<"$out" | head -3; fi
  "$TETRAD" train "${S[@]}" --device cpu --set run.dir="$W/cpu" > "$W/log" 2>&1 || { tail -20 "$W/log"; bad "cpu run"; exit 1; }
  if [ "$(losses "$W/nccl" | wc -l)" -eq $N ] &&
     paste <(losses "$W/cpu") <(losses "$W/nccl") |
       awk '{ d = $2 / $1 - 1; if (d < 0) d = -d; if (d > 1e-4 || $2 != $2) bad = 1; print "loss cpu " $1 " cuda+nccl " $2 }
            END { exit bad }'; then
    ok "$N losses with train.comm = nccl on the GPU within 1e-4 of the CPU's"
  else
    bad "GPU + NCCL losses differ from the CPU's"
  fi
  [ $fails -eq 0 ] && echo "all GPU NCCL training checks passed"
  exit $fails
fi

# Refusals, before any step and before the run folder is touched.
out=$("$TETRAD" train "${S[@]}" --device cpu --set train.comm=nccl --set run.dir="$W/r1" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'train.comm = "nccl" needs train.device = "cuda" (NCCL moves GPU memory), but train.device = "cpu"' <<<"$out" &&
   [ ! -e "$W/r1/metrics.jsonl" ]; then
  ok "train.comm=nccl on the CPU refused: $(grep -o 'train.comm = "nccl".*' <<<"$out" | head -1 | cut -c1-160)"
else
  bad "train.comm=nccl on the CPU (status $rc): $out"
fi
out=$("$TETRAD" train "${S[@]}" --device cpu-strict --set train.comm=nccl --set run.dir="$W/r2" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'train.comm = "nccl" needs train.device = "cuda".*train.device = "cpu-strict"' <<<"$out"; then
  ok "train.comm=nccl on cpu-strict refused"
else
  bad "train.comm=nccl on cpu-strict (status $rc): $out"
fi
out=$("$TETRAD" train "${S[@]}" --set train.comm=bogus --set run.dir="$W/r3" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'train.comm = "bogus": expected "auto", "mpi" or "nccl"' <<<"$out"; then
  ok "train.comm=bogus refused naming the choices"
else
  bad "train.comm=bogus (status $rc): $out"
fi

# auto on two CPU ranks: mpi, said in the log, and the same losses as train.comm = mpi.
"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --grid 2,1,1,1 --set run.dir="$W/auto" > "$W/log_auto" 2>&1 ||
  { tail -20 "$W/log_auto"; bad "auto: 2-rank cpu run"; }
if grep -q '^comm: mpi (train.comm = auto: train.device = cpu)' "$W/log_auto"; then
  ok "auto on the CPU: $(grep '^comm:' "$W/log_auto")"
else
  bad "auto on the CPU: no 'comm: mpi (train.comm = auto: train.device = cpu)' line"; grep -i '^comm' "$W/log_auto"
fi
"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --grid 2,1,1,1 --set train.comm=mpi --set run.dir="$W/mpi" > "$W/log_mpi" 2>&1 ||
  { tail -20 "$W/log_mpi"; bad "mpi: 2-rank cpu run"; }
if grep -q '^comm: mpi (train.comm = mpi)' "$W/log_mpi" && [ "$(losses "$W/mpi" | wc -l)" -eq $N ] &&
   cmp -s <(losses "$W/auto") <(losses "$W/mpi"); then
  ok "train.comm=mpi: said in the log, $N losses bit-identical to auto's"
else
  bad "train.comm=mpi against auto"; grep -i '^comm' "$W/log_mpi"; diff <(losses "$W/auto") <(losses "$W/mpi") | head
fi
# One rank: no communicator at all, and the log says so.
"$TETRAD" train "${S[@]}" --set train.max_steps=2 --set run.dir="$W/one" > "$W/log_one" 2>&1 || { tail -20 "$W/log_one"; bad "1-rank run"; }
if grep -q '^comm: none (one rank) (train.comm = auto: train.device = cpu)' "$W/log_one"; then
  ok "one rank: $(grep '^comm:' "$W/log_one")"
else
  bad "one rank: comm line"; grep -i '^comm' "$W/log_one"
fi
[ $fails -eq 0 ] && echo "all train.comm CLI checks passed"
exit $fails
