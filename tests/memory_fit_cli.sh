#!/usr/bin/env bash
# The memory check before the first step (train/device_memory.hpp): the trainer compares the
# planner's memory formula per rank with what the device has for the rank (Backend::
# memory_available, or train.memory_limit_mib) and logs the line "memory: formula X MiB of Y MiB
# available on DEVICE". A limit far below the formula stops the run before step 1 (no step, no
# checkpoint, no metrics) with the rank, the device, the formula's total and largest items, the
# limit and what to change; a limit just above the formula trains, one just below does not;
# invalid limits are refused. Serially and on a 2-rank grid under mpirun, on cpu and cpu-strict.
source "$(dirname "${BASH_SOURCE[0]}")/cli_common.sh" "$1"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
S=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.max_steps=2
   --set train.eval_interval=0 --set train.log_interval=1)
# A run that must stop before its first step: status, message parts, and nothing written.
refused() {  # refused NAME RUN_DIR LOG PATTERN...
  local name=$1 dir=$2 log=$3 rc=$4; shift 4
  local p missing=""
  for p in "$@"; do grep -Eq -- "$p" "$log" || missing+=" [$p]"; done
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ -z "$missing" ] && ! grep -Eq '^step +[0-9]' "$log" &&
     [ ! -e "$dir/checkpoints" ] && [ ! -e "$dir/metrics.jsonl" ]; then
    ok "$name: $(grep -m1 -o 'rank [0-9]* of [0-9]*: this run does not fit.*available ([^)]*)' "$log")"
  else
    bad "$name (status $rc; missing:$missing)"; cat "$log" | tail -5; ls "$dir" 2>/dev/null
  fi
}

for dev in cpu cpu-strict; do
  for mode in serial mpi; do
    case $mode in
      serial) G=(--grid 1,1,1,1); L=(); ranks=1 ;;
      mpi) G=(--grid 2,1,1,1); L=("${MPIRUN[@]}" -n 2); ranks=2 ;;
    esac
    tag="$dev $mode"
    # No limit: the device's own figure; the line names it and the run trains.
    run=$W/${dev}_${mode}_free
    "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --device $dev --set run.dir="$run" > "$W/log" 2>&1; rc=$?
    line=$(grep -m1 '^memory: formula' "$W/log")
    need=$(sed -n 's/^memory: formula \([0-9.]*\) MiB of .*/\1/p' <<<"$line")
    share=""; [ $ranks -gt 1 ] && share=" / $ranks ranks on the node"
    if [ $rc -eq 0 ] && grep -Eq "^memory: formula [0-9.]+ MiB of [0-9.]+ MiB available on $dev per rank \((MemAvailable|cgroup [a-z_.]+) [0-9.]+ MiB of [0-9.]+ MiB$share;" <<<"$line" &&
       [ "$(grep -c '"loss"' "$run/metrics.jsonl")" -eq 2 ]; then
      ok "$tag: trains, logging: ${line%%;*}"
    else
      bad "$tag: run without a limit (status $rc): $line"; tail -5 "$W/log"
    fi
    # Far below the formula: stopped before step 1 with the numbers.
    run=$W/${dev}_${mode}_low
    "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --device $dev --set run.dir="$run" \
      --set train.memory_limit_mib=1 --set model.n_embd=256 > "$W/log" 2>&1; rc=$?
    refused "$tag: 1 MiB limit" "$run" "$W/log" $rc \
      "rank [0-9] of $ranks: this run does not fit in memory on $dev: the memory formula needs [0-9.]+ MiB per rank but 1\.0 MiB are available \(train\.memory_limit_mib = 1\)" \
      "largest items: [a-z ]+ [0-9.]+ MiB, [a-z ]+ [0-9.]+ MiB, [a-z ]+ [0-9.]+ MiB \(weights [0-9.]+ MiB, gradients [0-9.]+ MiB, optimizer state [0-9.]+ MiB" \
      "To fit: more ranks on the grid \(parallel.grid" "train.micro_batch \(now [0-9]+\)" \
      'train.recompute = "selective" or "full"' "^memory: formula [0-9.]+ MiB of 1\.0 MiB available on $dev"
    [ $mode = mpi ] && ! grep -q "tetrad: error (rank [01]): rank [01] of 2: this run does not fit" "$W/log" &&
      bad "$tag: under mpirun the error does not name its rank" && grep error "$W/log"
    # Just above the formula trains; just below (where a whole MiB lies below it) does not.
    [ -n "$need" ] || continue
    up=$(awk -v n="$need" 'BEGIN { printf "%d", int(n) + 1 }')
    run=$W/${dev}_${mode}_up
    "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --device $dev --set run.dir="$run" \
      --set train.memory_limit_mib=$up > "$W/log" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "^memory: formula $need MiB of $up.0 MiB available on $dev per rank (train.memory_limit_mib = $up;" "$W/log" &&
       [ "$(grep -c '"loss"' "$run/metrics.jsonl")" -eq 2 ] && [ -e "$run/checkpoints/latest" ]; then
      ok "$tag: limit $up MiB above the formula's $need MiB: trains 2 steps and checkpoints"
    else
      bad "$tag: limit $up MiB (formula $need MiB), status $rc"; tail -5 "$W/log"
    fi
    down=$(awk -v n="$need" 'BEGIN { d = int(n); if (d == n) d -= 1; printf "%d", d }')
    if [ "$down" -ge 1 ]; then
      run=$W/${dev}_${mode}_down
      "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --device $dev --set run.dir="$run" \
        --set train.memory_limit_mib=$down > "$W/log" 2>&1; rc=$?
      refused "$tag: limit $down MiB just below the formula's $need MiB" "$run" "$W/log" $rc \
        "the memory formula needs $need MiB per rank but $down\.0 MiB are available"
    fi
  done
done

# The formula is the model's own count: the fit line's total equals the state + activations the
# model reports on its per-rank line (one memory formula, parallel::model_memory), in fp32 and in
# bf16 (fp32 master weights, gradients and Adam moments plus the bf16 weight copy; ln1, ln2, the
# final norm and the MLP activation stored in bf16 plus two bf16 gradient copies), serially and
# on 2 ranks; bf16's state is 18 bytes a parameter against fp32's 16 (the bf16 copy).
declare -A state
for prec in fp32 bf16; do
  for mode in serial mpi; do
    case $mode in
      serial) G=(--grid 1,1,1,1); L=() ;;
      mpi) G=(--grid 2,1,1,1); L=("${MPIRUN[@]}" -n 2) ;;
    esac
    run=$W/${prec}_${mode}_own
    "${L[@]}" "$TETRAD" train "${S[@]}" "${G[@]}" --set train.precision=$prec --set train.max_steps=1 \
      --set run.dir="$run" > "$W/log" 2>&1; rc=$?
    f=$(sed -n 's/^memory: formula \([0-9.]*\) MiB of .*/\1/p' "$W/log" | head -1)
    st=$(sed -n 's/.*; memory: state \([0-9.]*\) MiB .*/\1/p' "$W/log" | head -1)
    ac=$(sed -n 's/.*; memory: state .*), activations \([0-9.]*\) MiB (train.recompute.*/\1/p' "$W/log" | head -1)
    if [ $rc -eq 0 ] && [ -n "$f" ] && [ -n "$st" ] && [ -n "$ac" ] &&
       awk -v f="$f" -v s="$st" -v a="$ac" 'BEGIN { d = f - s - a; exit !(d < 0.06 && d > -0.06) }'; then
      ok "$prec $mode: formula $f MiB = the model's state $st + activations $ac MiB"
    else
      bad "$prec $mode: formula '$f' MiB against the model's state '$st' + activations '$ac' MiB (status $rc)"
      grep -E "^memory|memory: state|error" "$W/log" | head -5
    fi
    state[$prec$mode]=$st
  done
done
if awk -v a="${state[fp32serial]}" -v b="${state[bf16serial]}" 'BEGIN { r = (b - a) / a; exit !(a > 0 && r > 0.115 && r < 0.135) }'; then
  ok "bf16 state ${state[bf16serial]} MiB = fp32's ${state[fp32serial]} MiB x 18/16 (the bf16 weight copy)"
else
  bad "bf16 state '${state[bf16serial]}' MiB against fp32's '${state[fp32serial]}' MiB: expected 18/16 of it"
fi

# Invalid limits: refused naming the setting, before anything runs.
for v in -1 1.5 '"lots"'; do
  out=$("$TETRAD" train "${S[@]}" --set run.dir="$W/bad" "--set=train.memory_limit_mib=$v" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -Eq 'train.memory_limit_mib (must be >= 0|must be an integer)' <<<"$out" && [ ! -e "$W/bad" ]; then
    ok "train.memory_limit_mib = $v refused: $(grep -Eo 'train.memory_limit_mib must.*' <<<"$out" | head -1)"
  else
    bad "train.memory_limit_mib = $v (status $rc): $out"
  fi
done
[ $fails -eq 0 ] && echo "all memory-fit CLI checks passed"
exit $fails
