#!/usr/bin/env bash
# A job never hangs: (1) a rank killed with -9 mid-run ends the job, with a message naming the
# rank; (2) a rank stuck inside a step (test hook TETRAD_TEST_STALL_AT) is caught by its step
# watchdog (train.step_timeout), which names the rank, step and phase and ends the job; (3) a
# rank frozen with SIGSTOP (cannot report anything) makes its peers' next collective time out
# (train.comm_timeout), naming the operation and group and, by a roll call of the ranks still
# running, the rank that stopped (every message names the same one), and the job ends; (5) the
# same with a step watchdog shorter than the collective timeout: the peer's watchdog, its step
# stuck in a collective, names the operation and group it waits in and, by the roll call, the
# rank that stopped.
source "$(dirname "${BASH_SOURCE[0]}")/../cli_common.sh" "$1"
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=1000000
   --set train.eval_interval=0 --set train.log_interval=1000)
fails=0
ms() { echo $(($(date +%s%N) / 1000000)); }
# check NAME MAX_S EXPECT...: waits for $pid (started at $t0) at most MAX_S, needs non-zero status
# and every EXPECT in the log.
check() {
  local name=$1 max=$2; shift 2
  local rc=124
  for _ in $(seq 1 $((max * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; rc=$?; break; fi
    sleep 0.1
  done
  local took=$(( ($(ms) - t0) ))
  if [ "$rc" -eq 124 ]; then kill -9 "$pid" $(pgrep -P "$pid") 2>/dev/null; wait "$pid" 2>/dev/null; fi
  local ok=1
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || ok=0
  for e in "$@"; do grep -qF -- "$e" "$W/log" || ok=0; done
  if [ $ok -eq 1 ]; then echo "ok   $name: job ended (status $rc) $((took / 1000)).$(printf %03d $((took % 1000))) s after the fault"; grep -E "tetrad: error|exited on signal" "$W/log" | head -3 | sed "s/^/       /"
  else echo "FAIL $name (status $rc after $took ms)"; cat "$W/log"; fails=$((fails + 1)); fi
}
wait_steps() {  # until the job has done a few steps
  for _ in $(seq 1 300); do n=$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null); [ "${n:-0}" -ge 3 ] && return 0; sleep 0.1; done
  return 1
}

# 1. kill -9 one rank.
"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/r1" --grid 1,1,1,2 \
  --set train.comm_timeout=10 > "$W/log" 2>&1 &
pid=$!
wait_steps "$W/r1" || echo "(job 1 did not start training)"
victim=$(pgrep -P "$pid" | sed -n 2p)
t0=$(ms); kill -9 "$victim"
check "rank killed with -9" 30 "exited on signal 9"

# 2. A rank stuck in step 5 (hook), step watchdog 2 s; collectives would wait 60 s.
TETRAD_TEST_STALL_AT=1:5 "${MPIRUN[@]}" -n 2 -x TETRAD_TEST_STALL_AT "$TETRAD" train "${S[@]}" \
  --set run.dir="$W/r2" --grid 2,1,1,1 --set train.step_timeout=2 --set train.comm_timeout=60 > "$W/log" 2>&1 &
pid=$!
t0=$(ms)
check "rank stalled in a step (watchdog)" 40 "rank 1" "step 5 has spent more than 2 s in a training step"

# rank_pid MPIRUN_PID RANK: the process of that rank (its OMPI_COMM_WORLD_RANK).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo $p; return 0; }
  done
  return 1
}
# named RANK: every message of the job names RANK as the one that stopped, and no other.
named() {
  local who; who=$(grep -o "ranks\? [0-9, ]*stopped progressing" "$W/log" | sort -u)
  local lines; lines=$(grep -c "tetrad: error (rank " "$W/log")
  if [ "$who" = "rank $1 stopped progressing" ] &&
     [ "$(grep "tetrad: error (rank " "$W/log" | grep -c "rank $1 stopped progressing")" -eq "$lines" ]; then
    echo "ok   every message ($lines) names rank $1 as the rank that stopped"
  else echo "FAIL the messages do not all name rank $1: '$who'"; grep "tetrad: error" "$W/log" | cut -c1-400; fails=$((fails + 1)); fi
}

# 3. A rank frozen with SIGSTOP (rank 0, then rank 1): the peer's collective times out after 3 s
# and names the frozen rank (the roll call: it does not answer); the frozen rank, woken by
# mpirun's SIGCONT as the job ends, names itself (it saw that it did not run).
for victim_rank in 0 1; do
  "${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/r3_$victim_rank" --grid 1,1,2,1 \
    --set train.comm_timeout=3 > "$W/log" 2>&1 &
  pid=$!
  wait_steps "$W/r3_$victim_rank" || echo "(job 3 did not start training)"
  victim=$(rank_pid $pid $victim_rank)
  t0=$(ms); kill -STOP "$victim"
  check "rank $victim_rank frozen (collective timeout)" 40 "did not complete within 3 s" "tetrad: error (rank "
  named $victim_rank
  kill -9 "$victim" 2>/dev/null
done

# 4. Three data-parallel ranks, the middle one frozen: both others time out, answer each other's
# roll call and name the same rank.
"${MPIRUN[@]}" -n 3 "$TETRAD" train "${S[@]}" --set run.dir="$W/r4" --grid 1,1,1,3 --set train.micro_batch=3 \
  --set train.comm_timeout=3 > "$W/log" 2>&1 &
pid=$!
wait_steps "$W/r4" || echo "(job 4 did not start training)"
victim=$(rank_pid $pid 1)
t0=$(ms); kill -STOP "$victim"
check "rank 1 of 3 frozen (collective timeout)" 60 "did not complete within 3 s" "rank 1 stopped progressing"
named 1
grep -q "the 2 rank(s) still running answered" "$W/log" && echo "ok   the two running ranks answered each other" ||
  { echo "FAIL the running ranks did not hear each other"; fails=$((fails + 1)); }
kill -9 "$victim" 2>/dev/null

# 5. Rank 0 frozen, step watchdog 2 s, collectives 60 s: rank 1's watchdog ends the job, naming
# the collective (operation and group) and, by the roll call, rank 0.
"${MPIRUN[@]}" -n 2 "$TETRAD" train "${S[@]}" --set run.dir="$W/r5" --grid 1,1,2,1 \
  --set train.step_timeout=2 --set train.comm_timeout=60 > "$W/log" 2>&1 &
pid=$!
wait_steps "$W/r5" || echo "(job 5 did not start training)"
victim=$(rank_pid $pid 0)
t0=$(ms); kill -STOP "$victim"
check "rank 0 frozen (step watchdog of its peer)" 50 "(train.step_timeout), the last" "waiting in MPI " \
  " on group '" "rank 0 stopped progressing"
named 0
grep "tetrad: error (rank 1)" "$W/log" | grep -q "rank 1 stopped progressing" &&
  { echo "FAIL rank 1 called itself stalled"; fails=$((fails + 1)); }
kill -9 "$victim" 2>/dev/null
echo "$fails failed"
[ $fails -eq 0 ]
