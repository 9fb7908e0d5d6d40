#!/usr/bin/env bash
# kill -9 at random moments while a run checkpoints every step (asynchronously): after every kill
# the checkpoint `latest` names must exist and verify completely (every chunk checksum, a full
# load), and the next --resume must continue from it. Usage: ckpt_crash.sh TETRAD [KILLS]
# Every 4th kill hits a 2-rank mpirun job (all ranks killed at once, as a node failure would).
source "$(dirname "${BASH_SOURCE[0]}")/cli_common.sh" "$1"
KILLS=${2:-24}
S=(--set model.name=tiny --set data.dir="$W/data" --set run.dir="$W/run" --set train.seq_len=32
   --set train.max_steps=100000 --set train.eval_interval=0 --set train.checkpoint_interval=1
   --set train.keep_checkpoints=2 --set train.log_interval=1000)
RANDOM=7
kills=0; lost=0; mid_write=0; resumed=0; steps_seen=0
for k in $(seq 1 "$KILLS"); do
  if [ $((k % 4)) -eq 0 ]; then
    "${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --grid 1,1,1,2 --resume > "$W/log" 2>&1 &
  else
    "$TETRAD" train "${S[@]}" --resume > "$W/log" 2>&1 &
  fi
  pid=$!
  # Wait for the job to be training (however long a loaded machine takes to start it: a 10 s
  # bound once let the kill below find no rank yet, and the job trained on until CTest's
  # timeout), then a random 0-400 ms more. A job that never trains fails the test, not hangs it.
  started=0
  for _ in $(seq 1 2400); do
    grep -q "^step\|resumed from" "$W/log" 2>/dev/null && { started=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if [ $started -eq 0 ]; then
    echo "FAIL kill $k: the job did not start training"; cat "$W/log"
    kill -9 $(pgrep -P "$pid") "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    exit 1
  fi
  sleep "0.$(printf %03d $((RANDOM % 400)))"
  if [ $((k % 4)) -eq 0 ]; then
    kids=$(pgrep -P "$pid" | tr '\n' ' ')
    kill -9 $kids 2>/dev/null
  else
    kill -9 "$pid" 2>/dev/null
  fi
  # The job must end now; if it does not, say so instead of waiting for CTest's timeout.
  for _ in $(seq 1 1200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL kill $k: the job survived kill -9 of its processes (${kids:-$pid})"
    kill -9 $(pgrep -P "$pid") "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    exit 1
  fi
  wait "$pid" 2>/dev/null
  kills=$((kills + 1))
  grep -q "resumed from" "$W/log" && resumed=$((resumed + 1))
  ls "$W/run/checkpoints" 2>/dev/null | grep -q '\.tmp$' && mid_write=$((mid_write + 1))
  [ -f "$W/run/checkpoints/latest" ] || continue  # killed before the first checkpoint
  if out=$("$TETRAD" verify --model "$W/run" 2>&1); then
    steps_seen=$(sed -n 's/.* step \([0-9]*\),.*/\1/p' <<<"$out")
  else
    echo "LOST after kill $k: $out"; lost=$((lost + 1))
  fi
done
echo "kills: $kills; killed with a save in progress (a .tmp folder left): $mid_write; runs that resumed: $resumed; latest step verified at the end: $steps_seen; checkpoints lost: $lost"
[ "$lost" -eq 0 ] && [ "$resumed" -ge $((KILLS / 2)) ] && [ "$mid_write" -ge 1 ]
