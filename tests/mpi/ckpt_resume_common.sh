# Sourced by the checkpoint resharding tests (ckpt_any_grid.sh, ckpt_expert_fold.sh) after they
# set S, the training settings of every run (6 steps, warm-up over all of them, fp32 attention,
# the rule's GEMM layouts): running on a grid, the one-rank reference run, and the two checks,
# resumed on another grid (within fp32 tolerance of the reference) and on the same grid
# (bit-identical to that grid's uninterrupted run). Failures are counted in $fails.
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }
run() {  # run GRID ARGS...: one rank without mpirun, else mpirun -n (the product of the grid's
         # extents: "2,1,1,1" or named "c=2,d=2"; the expert fold e=E is not counted)
  local g=$1; shift
  local n=$(( $(echo "$g" | sed -E 's/(^|,)e=[0-9]+//; s/^,//; s/[a-z]=//g' | tr ',' '*') ))
  if [ "$n" -eq 1 ]; then "$TETRAD" train "${S[@]}" --grid "$g" "$@"
  else "${MPIRUN[@]}" -n "$n" "$TETRAD" train "${S[@]}" --grid "$g" "$@"; fi
}
close() {  # close A B: every line within 1e-5 relative, same count
  paste "$1" "$2" | awk -v n="$(wc -l < "$1")" '{ c++; d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > 1e-5) bad = 1 } END { exit (bad || c != n) }'
}
fails=0
run 1,1,1,1 --set run.dir="$W/ref" > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
losses "$W/ref" > "$W/ref.txt"
[ "$(wc -l < "$W/ref.txt")" -eq 6 ] || { echo "the reference run logged no 6 losses"; exit 1; }

# resumes A B...: a run saved after 3 steps on grid A resumes with B... (a grid and settings, as
# run takes them) from step 3, and its 6 losses match the one-rank run that never stopped.
resumes() {
  local a=$1; shift
  local R; R="$W/run_$(echo "$a $*" | tr -c 'a-zA-Z0-9' _)"
  if ! run "$a" --set run.dir="$R" --set train.max_steps=3 > "$W/log" 2>&1 ||
     ! run "$@" --set run.dir="$R" --resume > "$W/log2" 2>&1; then
    echo "FAIL $a -> $*: a run failed"; cat "$W/log" "$W/log2"; fails=$((fails + 1)); return
  fi
  losses "$R" > "$W/got.txt"
  if grep -q "resumed from .*step_000003 at step 3" "$W/log2" && close "$W/ref.txt" "$W/got.txt"; then
    echo "ok   saved on $a, resumed on $*: 6 losses match the one-rank run"
  else
    echo "FAIL saved on $a, resumed on $*"; cat "$W/log2"; paste "$W/ref.txt" "$W/got.txt"
    fails=$((fails + 1))
  fi
}

# resumes_bit_identical G: on grid G, a run stopped after 3 steps and resumed has the losses of
# the run that never stopped, bit for bit.
resumes_bit_identical() {
  local g=$1 u="$W/u_${1//[=,]/_}" s="$W/s_${1//[=,]/_}"
  if ! run "$g" --set run.dir="$u" > "$W/log" 2>&1 ||
     ! run "$g" --set run.dir="$s" --set train.max_steps=3 > "$W/log" 2>&1 ||
     ! run "$g" --set run.dir="$s" --resume > "$W/log2" 2>&1; then
    echo "FAIL grid $g: a run failed"; cat "$W/log" "$W/log2"; fails=$((fails + 1)); return
  fi
  if cmp -s <(losses "$u") <(losses "$s") && [ "$(losses "$s" | wc -l)" -eq 6 ]; then
    echo "ok   grid $g: resumed losses bit-identical to the uninterrupted run"
  else
    echo "FAIL grid $g: not bit-identical"; paste <(losses "$u") <(losses "$s"); fails=$((fails + 1))
  fi
}
