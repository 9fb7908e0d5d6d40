#!/usr/bin/env bash
# Every command as safe as `train` (issue 31): a command that writes takes the lock of what it
# writes, builds it beside its destination and publishes it whole, and replaces nothing it did not
# create without --overwrite; a reader never writes inside a run folder. One case per CTest test.
# Usage: command_safety.sh TETRAD CASE
#   import   import over an existing run (refused naming its latest checkpoint; --overwrite
#            replaces it, never while its trainer holds the lock), over a file, into a new folder
#   readers  export --out and report -o inside a run folder (its checkpoint, meta.json,
#            metrics.jsonl, train.lock, latest), over existing output (refused without --overwrite)
#   prepare  prepare into an existing data folder: an input error or SIGTERM/SIGKILL at any moment
#            leaves the old folder whole; a second prepare on the folder is refused naming the
#            first; leftovers of a killed one are removed by the next
#   resume_identity  resume with another seed, other data or another tokenizer: refused by name;
#            --allow-data-change continues and records it in metrics.jsonl
#   model_size  a config.json with absurd sizes: import, generate, logits, export, eval refuse
#            before allocating, naming the sizes and the memory
#   verify   verify refuses a run or model folder whose config.json or tokenizer readers cannot use,
#            or whose weights or AdamW moments hold a NaN or an infinity (naming the tensor)
#   jsonl    JSON-lines documents of any length prepare; --skip-bad-lines skips a long bad line
#   concurrent  train, prepare, import, export, report -o twice at once on one target
#   wrong_type  every reader given a file of the wrong kind: exit 1, a clear message
#   final_state  a run whose weights end non-finite exits 1 saying what the latest checkpoint is
#   interrupted import, export, report -o killed (SIGKILL) or stopped (SIGTERM, SIGINT) at random
#            points, many times
#   resume_old  old checkpoints (no data fingerprint; the legacy format) compared where they can be
#   init_refused a train refused at its start leaves no run folder; run.init_from with weights
#            that are not finite refused naming the tensor and the first bad element
#   early_signal SIGTERM during start-up stops cleanly before the first step (exit 0, checkpoint)
source "$(dirname "${BASH_SOURCE[0]}")/cli_common.sh" "$1"
CASE=$2
fails=0
T=(--set model.name=tiny --set data.dir="$W/data" --set train.seq_len=32 --set train.log_interval=1000
   --set train.eval_interval=0)
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); [ -f "$W/out" ] && tail -5 "$W/out"; }
# refused NAME PATTERN CMD...: CMD exits 1 (an error, not a crash) saying PATTERN.
refused() {
  local name=$1 pat=$2; shift 2
  "$@" > "$W/out" 2>&1; local rc=$?
  if [ $rc -eq 1 ] && grep -qF -- "$pat" "$W/out"; then ok "$name: refused ($(grep -m1 error "$W/out" | cut -c1-150)...)"
  else bad "$name: status $rc, expected 1 and '$pat'"; fi
}
# works NAME CMD...: CMD exits 0.
works() {
  local name=$1; shift
  if "$@" > "$W/out" 2>&1; then ok "$name"; else bad "$name: status $?"; fi
}
# The tree of a folder: every file with its checksum.
tree_sum() { (cd "$1" && find . -type f ! -name train.lock ! -name prepare.lock -print0 | sort -z | xargs -0 md5sum); }
latest() { cat "$1/checkpoints/latest" 2>/dev/null; }

train_run() {  # train_run DIR STEPS: a finished run with checkpoints every 2 steps
  "$TETRAD" train "${T[@]}" --set run.dir="$1" --set train.max_steps="$2" \
    --set train.checkpoint_interval=2 --set train.keep_checkpoints=5 > "$1.log" 2>&1 || { cat "$1.log"; exit 1; }
}

case_import() {
  train_run "$W/r" 6
  "$TETRAD" export --model "$W/r" --out "$W/hf" > /dev/null 2>&1 || { echo "export failed"; exit 1; }
  tree_sum "$W/r" > "$W/r.sum"
  refused "import over a run with checkpoints" "the latest $W/r/checkpoints/step_000006" \
    "$TETRAD" import --hf "$W/hf" --out "$W/r"
  grep -qF -- "--overwrite" "$W/out" || bad "import refusal does not name --overwrite"
  tree_sum "$W/r" | cmp -s - "$W/r.sum" && [ "$(latest "$W/r")" = step_000006 ] &&
    ok "the refused import left the run as it was (latest step_000006)" || bad "the refused import changed the run"
  refused "import over a run, trailing slash" "step_000006" "$TETRAD" import --hf "$W/hf" --out "$W/r/"
  echo x > "$W/file"
  refused "import --out a file" "is not a folder" "$TETRAD" import --hf "$W/hf" --out "$W/file"
  mkdir -p "$W/other"; echo x > "$W/other/notes.txt"
  refused "import --out a folder of other things, even with --overwrite" "not replacing it" \
    "$TETRAD" import --hf "$W/hf" --out "$W/other" --overwrite
  [ -f "$W/other/notes.txt" ] || bad "the folder of other things was touched"

  # A trainer running on r2: import --overwrite must not touch it.
  "$TETRAD" train "${T[@]}" --set run.dir="$W/r2" --set train.max_steps=100000 \
    --set train.checkpoint_interval=5 > "$W/r2.log" 2>&1 & local pid=$!
  for _ in $(seq 1 1200); do [ -n "$(latest "$W/r2")" ] && break; sleep 0.05; done
  refused "import --overwrite while a trainer holds the run's lock" "is in use" \
    "$TETRAD" import --hf "$W/hf" --out "$W/r2" --overwrite
  if [ "$(latest "$W/r2")" != step_000000 ] && [ -f "$W/r2/train.lock" ] && kill -0 $pid 2>/dev/null; then
    ok "the trainer's run is untouched (latest $(latest "$W/r2"), lock in place, trainer running)"
  else bad "the trainer's run was changed (latest $(latest "$W/r2"))"; fi
  kill -TERM $pid; wait $pid
  [ "$(latest "$W/r2")" != step_000000 ] || bad "the stopped trainer's run was replaced"

  works "import --overwrite replaces a run" "$TETRAD" import --hf "$W/hf" --out "$W/r" --overwrite
  if [ "$(latest "$W/r")" = step_000000 ] && [ ! -e "$W/r/metrics.jsonl" ] && [ ! -e "$W/r/train.lock" ] &&
     [ "$(ls "$W/r/checkpoints" | grep -c '^step_')" -eq 1 ] && "$TETRAD" verify --model "$W/r" > /dev/null 2>&1; then
    ok "the replaced run holds only the import (step_000000, verified), no lock left"
  else bad "the replaced run: latest $(latest "$W/r"), $(ls "$W/r" "$W/r/checkpoints" | tr '\n' ' ')"; fi
  works "import into a new folder" "$TETRAD" import --hf "$W/hf" --out "$W/new/run"
  mkdir -p "$W/empty"
  works "import into an empty folder" "$TETRAD" import --hf "$W/hf" --out "$W/empty"
  [ "$(latest "$W/empty")" = step_000000 ] || bad "import into an empty folder: no checkpoint"
  ls -d "$W"/*.tmp-* "$W"/new/*.tmp-* 2>/dev/null | grep -q . && bad "temporary folders left: $(ls -d "$W"/*.tmp-*)"
  # An import that fails (a damaged model) leaves nothing behind.
  cp -r "$W/hf" "$W/hf_bad"; echo garbage > "$W/hf_bad/model.safetensors"
  "$TETRAD" import --hf "$W/hf_bad" --out "$W/fail" > "$W/out" 2>&1
  [ ! -e "$W/fail" ] && ! ls -d "$W"/fail.tmp-* > /dev/null 2>&1 && ok "a failed import leaves no folder" ||
    bad "a failed import left $(ls -d "$W"/fail*)"
}

case_readers() {
  train_run "$W/r" 6
  local ck=$W/r/checkpoints/step_000006
  tree_sum "$W/r" > "$W/r.sum"
  refused "export --out the latest checkpoint" "inside the run folder" \
    "$TETRAD" export --model "$W/r" --out "$ck"
  refused "export --out the run folder" "is the run folder" "$TETRAD" export --model "$W/r" --out "$W/r"
  refused "export --out a new folder inside the run" "inside the run folder" \
    "$TETRAD" export --model "$W/r" --out "$W/r/hf" --overwrite
  for f in "$ck/meta.json" "$W/r/metrics.jsonl" "$W/r/config.toml" "$W/r/checkpoints/latest" "$W/r/train.lock" "$W/r/new.html"; do
    refused "report -o ${f#$W/}" "inside the run folder" "$TETRAD" report "$W/r" -o "$f" --overwrite
  done
  refused "report with the default name inside the run folder" "inside the run folder" \
    bash -c "cd '$W/r/checkpoints' && '$(realpath "$TETRAD")' report '$W/r'"
  # A symbolic link into the run folder is inside it too.
  ln -s "$W/r/checkpoints" "$W/link"
  refused "export --out through a link into the run" "inside the run folder" \
    "$TETRAD" export --model "$W/r" --out "$W/link/x"
  tree_sum "$W/r" | cmp -s - "$W/r.sum" && "$TETRAD" verify --model "$W/r" > /dev/null 2>&1 &&
    ok "the run folder is untouched and verifies" || bad "the run folder was changed"

  works "export to a new folder" "$TETRAD" export --model "$W/r" --out "$W/hf"
  tree_sum "$W/hf" > "$W/hf.sum"
  refused "export over an existing model folder" "--overwrite" "$TETRAD" export --model "$W/r" --out "$W/hf"
  tree_sum "$W/hf" | cmp -s - "$W/hf.sum" || bad "the refused export changed the folder"
  works "export --overwrite" "$TETRAD" export --model "$W/r" --out "$W/hf" --overwrite
  mkdir -p "$W/other"; echo x > "$W/other/notes.txt"
  refused "export over a folder of other things" "not replacing it" \
    "$TETRAD" export --model "$W/r" --out "$W/other" --overwrite
  echo x > "$W/file"
  refused "export --out a file" "is not a folder" "$TETRAD" export --model "$W/r" --out "$W/file" --overwrite
  mkdir -p "$W/empty"
  works "export into an empty folder" "$TETRAD" export --model "$W/r" --out "$W/empty"

  works "report to a new file" "$TETRAD" report "$W/r" -o "$W/rep.html"
  cp "$W/rep.html" "$W/rep.orig"; echo mine > "$W/mine.html"
  refused "report over an existing file" "--overwrite" "$TETRAD" report "$W/r" -o "$W/mine.html"
  [ "$(cat "$W/mine.html")" = mine ] || bad "the refused report changed the file"
  works "report --overwrite" "$TETRAD" report "$W/r" -o "$W/mine.html" --overwrite
  grep -q "<html" "$W/mine.html" || bad "report --overwrite did not write the page"
  refused "report -o a folder" "is a folder" "$TETRAD" report "$W/r" -o "$W/other" --overwrite
  ls -d "$W"/*.tmp-* 2>/dev/null | grep -q . && bad "temporary files left: $(ls -d "$W"/*.tmp-*)"
}

case_prepare() {
  local D=$W/data
  tree_sum "$D" > "$W/d.sum"
  same_data() { tree_sum "$D" | cmp -s - "$W/d.sum"; }
  # A JSON error at line 51 of the new input: refused, the old folder untouched.
  for i in $(seq 1 50); do echo "{\"text\": \"document $i of the new corpus\"}"; done > "$W/bad.jsonl"
  echo '{"text": broken' >> "$W/bad.jsonl"
  refused "prepare with a JSON error at line 51" "line 51" \
    "$TETRAD" prepare --input "$W/bad.jsonl" --out "$D" --vocab-size 300
  same_data && ok "the failed prepare left the old data folder whole" || bad "the failed prepare changed the data folder"
  "$TETRAD" prepare --input "$W/bad.jsonl" --out "$W/new_data" --vocab-size 300 > /dev/null 2>&1
  [ ! -e "$W/new_data" ] && ok "a failed prepare into a new folder leaves none" || bad "a failed prepare left $W/new_data"
  echo x > "$W/file"
  refused "prepare --out a file" "is not a folder" "$TETRAD" prepare --input "$W/c.txt" --out "$W/file"

  # A larger corpus, so that a prepare takes a while.
  for i in $(seq 1 60000); do echo "line $i: the $((i % 97)) kings of the $((i % 13)) cities went up, and $((i * 7 % 1000)) people followed."; done > "$W/big.txt"
  # Interrupted at random moments (SIGINT and SIGKILL): the folder is the old one, whole.
  local n=0 intact=0
  cp -r "$D" "$W/d.orig"
  for delay in 0.1 0.4 0.8 1.5 0.2 0.6 1.0 2.0; do
    n=$((n + 1))
    # SIGTERM for Ctrl-C's SIGINT (the same default action; a script's background commands start
    # with SIGINT ignored).
    local sig=TERM; [ $((n % 2)) -eq 0 ] && sig=KILL
    "$TETRAD" prepare --input "$W/big.txt" --doc-split line --out "$D" --vocab-size 300 > "$W/p.log" 2>&1 & local pid=$!
    sleep $delay
    if kill -0 $pid 2>/dev/null; then
      kill -$sig $pid; wait $pid
      if same_data; then intact=$((intact + 1)); else bad "SIG$sig after $delay s: the data folder changed"; ls "$D"; fi
    else
      wait $pid; echo "     (prepare finished before $delay s; restoring the old folder)"
      rm -rf "$D"; cp -r "$W/d.orig" "$D"
    fi
  done
  [ $intact -ge 4 ] && ok "$intact prepares killed (SIGTERM/SIGKILL) at 0.1-2 s: the old data folder whole each time" ||
    bad "only $intact interrupted prepares checked"
  # The next prepare removes what the killed ones left beside the folder.
  if ls -d "$D".tmp-* > /dev/null 2>&1; then
    works "prepare after killed ones" "$TETRAD" prepare --input "$W/c.txt" --out "$D" --vocab-size 300
    grep -q "left by an interrupted prepare" "$W/out" && ! ls -d "$D".tmp-* > /dev/null 2>&1 &&
      ok "their leftovers were removed, saying so" || bad "leftovers of killed prepares: $(ls -d "$D".tmp-* 2>/dev/null)"
  fi

  # Two prepares on one folder: the second is refused naming the first, which completes.
  "$TETRAD" prepare --input "$W/big.txt" --doc-split line --out "$D" --vocab-size 300 > "$W/p1.log" 2>&1 & local p1=$!
  for _ in $(seq 1 400); do [ -e "$D/prepare.lock" ] && break; sleep 0.01; done
  refused "a second prepare on the same folder" "pid $p1" \
    "$TETRAD" prepare --input "$W/c.txt" --out "$D" --vocab-size 300
  grep -qF "being prepared by another" "$W/out" || bad "the refusal does not say why"
  wait $p1; local rc1=$?
  if [ $rc1 -eq 0 ] && [ -f "$D/meta.json" ] && [ ! -e "$D/prepare.lock" ] && grep -q '"documents": 60000' "$D/meta.json"; then
    ok "the first prepare completed (60000 documents, no lock left)"
  else bad "the first prepare: status $rc1, $(ls "$D" | tr '\n' ' ')"; tail -3 "$W/p1.log"; fi
  "$TETRAD" train "${T[@]}" --set run.dir="$W/r" --set train.max_steps=2 > "$W/out" 2>&1 &&
    ok "train reads the prepared folder" || bad "train on the prepared folder failed"
}

# poison FILE TENSOR VALUE I J: sets element [I, J] (the file's layout) of a 2-D float32 tensor of a
# safetensors file to VALUE (inf, nan, -inf).
poison() {
  python3 - "$@" <<'PY'
import json, struct, sys
path, name, value, i, j = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
b = bytearray(open(path, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
t = json.loads(b[8:8 + n])[name]
assert t['dtype'] == 'F32', t
at = 8 + n + t['data_offsets'][0] + 4 * (i * t['shape'][1] + j)
b[at:at + 4] = struct.pack('<f', value)
open(path, 'wb').write(b)
PY
}

case_final_state() {
  # A model whose weights are not finite: run.init_from such weights is refused at the start
  # (case init_refused); resumed from them (a damaged checkpoint), every step is skipped, no
  # checkpoint may be written over the one it resumed from, and the run must not exit 0.
  train_run "$W/r" 2
  "$TETRAD" export --model "$W/r" --out "$W/hf" > /dev/null 2>&1 || { echo "export failed"; exit 1; }
  python3 - "$W/hf/model.safetensors" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
b[8 + n:8 + n + 4096] = struct.pack('<f', float('inf')) * 1024
open(sys.argv[1], 'wb').write(b)
PY
  # import refuses such weights (case init_refused) and writes nothing.
  refused "import of a model with inf weights" "holds 1024 value(s) that are not finite" \
    "$TETRAD" import --hf "$W/hf" --out "$W/imp"
  [ ! -e "$W/imp" ] && ok "the refused import left no run folder" || bad "the refused import left: $(ls -A "$W/imp")"
  # So the run's own checkpoint is damaged instead, with its checksums written again (as a
  # fault no checksum catches: memory, or a bug, before the save).
  python3 "$(dirname "${BASH_SOURCE[0]}")/old_checkpoint.py" poison "$W/r/checkpoints/step_000002" inf 16 ||
    { echo "poisoning the checkpoint failed"; exit 1; }
  refused "a resumed run ending with non-finite weights" "the latest checkpoint is still $W/r/checkpoints/step_000002" \
    "$TETRAD" train "${T[@]}" --set run.dir="$W/r" --set train.max_steps=4 --resume
  grep -q "no final checkpoint was written" "$W/out" || bad "the message does not say that no final checkpoint was written"
  [ "$(latest "$W/r")" = step_000002 ] && [ "$(ls "$W/r/checkpoints" | grep -c step_)" -eq 1 ] &&
    ok "no checkpoint written over it" || bad "checkpoints: $(ls "$W/r/checkpoints")"
}

case_init_refused() {
  # A train refused while it starts (after it claimed run.dir) leaves nothing it created; a
  # run.init_from whose weights are not finite is refused at the start, naming the tensor and
  # the first bad element.
  train_run "$W/r" 2
  "$TETRAD" export --model "$W/r" --out "$W/hf" > /dev/null 2>&1 || { echo "export failed"; exit 1; }
  cp -r "$W/hf" "$W/hf_inf"; cp -r "$W/hf" "$W/hf_nan"
  poison "$W/hf_inf/model.safetensors" transformer.h.0.attn.c_attn.weight inf 3 5
  poison "$W/hf_inf/model.safetensors" transformer.h.0.attn.c_attn.weight -inf 40 1
  poison "$W/hf_nan/model.safetensors" transformer.wpe.weight nan 2 9
  refused "run.init_from with inf weights" \
    "tensor transformer.h.0.attn.c_attn.weight (shape [64, 192]) holds 2 value(s) that are not finite, the first at [3, 5] (inf)" \
    "$TETRAD" train "${T[@]}" --set run.dir="$W/new/deeper/run" --set train.max_steps=2 --set run.init_from="$W/hf_inf"
  [ ! -e "$W/new" ] && ok "the refused train left no run folder (nor the folders it made above it)" ||
    bad "the refused train left: $(find "$W/new")"
  refused "run.init_from with a NaN weight" "tensor transformer.wpe.weight (shape [64, 64]) holds 1 value(s) that are not finite, the first at [2, 9] (nan)" \
    "$TETRAD" train "${T[@]}" --set run.dir="$W/new2" --set train.max_steps=2 --set run.init_from="$W/hf_nan"
  [ ! -e "$W/new2" ] && ok "no run folder left" || bad "the refused train left $W/new2"
  # import refuses the same weights the same way, writing nothing.
  refused "import with inf weights" \
    "import --hf '$W/hf_inf': tensor transformer.h.0.attn.c_attn.weight (shape [64, 192]) holds 2 value(s) that are not finite, the first at [3, 5] (inf)" \
    "$TETRAD" import --hf "$W/hf_inf" --out "$W/imported"
  refused "import with a NaN weight" "tensor transformer.wpe.weight (shape [64, 64]) holds 1 value(s) that are not finite" \
    "$TETRAD" import --hf "$W/hf_nan" --out "$W/imported"
  [ -z "$(ls -d "$W"/imported* 2> /dev/null)" ] && ok "the refused imports left nothing" ||
    bad "the refused imports left: $(ls -d "$W"/imported*)"
  # A folder that was there before is left there (empty, as it was); one holding a file too.
  mkdir -p "$W/mine"
  refused "refused into an existing empty folder" "not finite" \
    "$TETRAD" train "${T[@]}" --set run.dir="$W/mine" --set train.max_steps=2 --set run.init_from="$W/hf_nan"
  [ -d "$W/mine" ] && [ -z "$(ls -A "$W/mine")" ] && ok "the existing folder is left, empty" || bad "the existing folder: $(ls -A "$W/mine" 2>&1)"
  # Other refusals after the claim: a tokenizer that is not the data's, a model too big for memory.
  "$TETRAD" prepare --input "$W/c.txt" --out "$W/data3" --vocab-size 320 > /dev/null 2>&1 || bad "prepare data3 failed"
  refused "run.init_from with another tokenizer" "prepare the data with --tokenizer" \
    "$TETRAD" train --set model.name=tiny --set data.dir="$W/data3" --set train.seq_len=32 \
    --set run.dir="$W/new3/run" --set train.max_steps=2 --set run.init_from="$W/hf"
  [ ! -e "$W/new3" ] && ok "no run folder left" || bad "the refused train left: $(find "$W/new3")"
  # The good weights still start a run there, and the run folder is kept.
  works "run.init_from with finite weights" "$TETRAD" train "${T[@]}" --set run.dir="$W/new/deeper/run" \
    --set train.max_steps=2 --set run.init_from="$W/hf"
  [ -n "$(latest "$W/new/deeper/run")" ] && ok "that run has its checkpoint" || bad "no checkpoint in the run that started"
}

case_early_signal() {
  # SIGTERM while train is starting up (data checked, model allocated, checkpoint loaded): a
  # clean stop before the first step with a final checkpoint, exit 0, not the default action.
  local S=(--set model.name=small --set model.vocab_size=512 --set model.n_layer=2)
  local n=0
  for how in handler 0.4 0.8 handler; do
    rm -rf "$W/s"; n=$((n + 1))
    "$TETRAD" train "${T[@]}" "${S[@]}" --set run.dir="$W/s" --set train.max_steps=100000 > "$W/out" 2>&1 & local pid=$!
    if [ $how = handler ]; then  # as soon as the signal catcher thread exists (OMP_NUM_THREADS=1)
      for _ in $(seq 1 4000); do [ "$(ls /proc/$pid/task 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.002; done
    else sleep $how; fi
    kill -TERM $pid; wait $pid; local rc=$?
    if [ $rc -eq 0 ] && grep -q "received SIGTERM" "$W/out" && [ -n "$(latest "$W/s")" ] &&
       "$TETRAD" verify --model "$W/s" > /dev/null 2>&1; then
      ok "SIGTERM at $how: exit 0, $(grep -o 'stopping at step [0-9]*' "$W/out"), $(latest "$W/s") verifies"
    else bad "SIGTERM at $how: status $rc, latest '$(latest "$W/s")'"; fi
    [ $how = handler ] && { grep -q "stopping at step 0" "$W/out" || bad "SIGTERM at start-up was not taken before the first step"; }
  done
  # The run resumes from the step-0 checkpoint as if never stopped.
  "$TETRAD" train "${T[@]}" "${S[@]}" --set run.dir="$W/s" --set train.max_steps=2 --resume > "$W/out" 2>&1 &&
    grep -q "resumed from" "$W/out" && ok "resumes from it" || bad "resume after an early stop failed"
}

case_resume_identity() {
  # Resume must continue the same data order: a changed seed or other training data is refused by
  # name (before any weight is read), a tokenizer change always; --allow-data-change continues on
  # purpose and says so in metrics.jsonl.
  train_run "$W/r" 4
  tree_sum "$W/r" > "$W/r.sum"
  local R=("$TETRAD" train "${T[@]}" --set run.dir="$W/r" --set train.max_steps=6 --resume)
  refused "resume with another train.seed" "train.seed: checkpoint 1337, config 7" "${R[@]}" --set train.seed=7
  grep -qF -- "--allow-data-change" "$W/out" || bad "the refusal does not name --allow-data-change"
  grep -q "trying the previous checkpoint" "$W/out" && bad "a seed change tried older checkpoints"
  # Other data made with the same tokenizer (smaller, a different text).
  for i in $(seq 1 60); do echo "a different corpus, line $i: the sea and the ships went down."; done > "$W/c2.txt"
  "$TETRAD" prepare --input "$W/c2.txt" --out "$W/data2" --tokenizer "$W/data/tokenizer.model" > /dev/null 2>&1 ||
    bad "prepare with the run's tokenizer failed"
  refused "resume on other data" "the training data: checkpoint" "${R[@]}" --set data.dir="$W/data2"
  # The same text prepared again into another folder is the same data.
  "$TETRAD" prepare --input "$W/c.txt" --out "$W/data_again" --vocab-size 300 > /dev/null 2>&1 || bad "prepare again failed"
  # Another tokenizer: never continued, even with --allow-data-change.
  "$TETRAD" prepare --input "$W/c.txt" --out "$W/data3" --vocab-size 320 > /dev/null 2>&1 || bad "prepare data3 failed"
  refused "resume on data of another tokenizer" "the token ids would mean other text" \
    "${R[@]}" --set data.dir="$W/data3" --allow-data-change
  tree_sum "$W/r" | cmp -s - "$W/r.sum" && ok "the refused resumes left the run as it was" || bad "a refused resume changed the run"

  cp -r "$W/r" "$W/r_same"
  works "resume on the same data prepared again" "$TETRAD" train "${T[@]}" --set run.dir="$W/r_same" \
    --set train.max_steps=6 --resume --set data.dir="$W/data_again"
  works "resume with another seed, --allow-data-change" "${R[@]}" --set train.seed=7 --allow-data-change
  grep -q "continuing with a change (--allow-data-change): train.seed" "$W/out" || bad "the allowed change was not said"
  grep '"event":"data_change"' "$W/r/metrics.jsonl" | grep -q 'train.seed: checkpoint 1337, config 7' && ok "metrics.jsonl records the change" ||
    bad "no data_change record in metrics.jsonl"
  works "resume on other data, --allow-data-change" "$TETRAD" train "${T[@]}" --set run.dir="$W/r" \
    --set train.max_steps=8 --resume --set train.seed=7 --set data.dir="$W/data2" --allow-data-change
  grep '"event":"data_change"' "$W/r/metrics.jsonl" | grep -q 'the training data' || bad "no data_change record for the data"
  # The next resume on that data with that seed continues without a word.
  works "resume after the allowed change" "$TETRAD" train "${T[@]}" --set run.dir="$W/r" \
    --set train.max_steps=10 --resume --set train.seed=7 --set data.dir="$W/data2"
  grep -q "continuing with a change" "$W/out" && bad "the accepted change was reported again"
}

case_resume_old() {
  # Checkpoints written before the data record was complete, made by removing what older tetrads
  # did not write (tests/old_checkpoint.py, which rewrites the checksums): what they hold is
  # compared (the seed, seq_len and data.dir from the configuration they recorded or the run's
  # config.toml; the tokenizer a legacy checkpoint carries); what they lack (the data
  # fingerprint) is said once, not passed over. The legacy format (parallel.zero >= 1) keeps the
  # whole record from now on and is compared as the sharded one is.
  local OLD="python3 $(dirname "${BASH_SOURCE[0]}")/old_checkpoint.py"
  for i in $(seq 1 60); do echo "a different corpus, line $i: the sea and the ships went down."; done > "$W/c2.txt"
  "$TETRAD" prepare --input "$W/c2.txt" --out "$W/data2" --tokenizer "$W/data/tokenizer.model" > /dev/null 2>&1 || bad "prepare data2 failed"
  "$TETRAD" prepare --input "$W/c.txt" --out "$W/data3" --vocab-size 320 > /dev/null 2>&1 || bad "prepare data3 failed"
  local Z=(--set parallel.zero=1)
  "$TETRAD" train "${T[@]}" "${Z[@]}" --set run.dir="$W/l" --set train.max_steps=4 --set train.checkpoint_interval=2 \
    > "$W/l.log" 2>&1 || { cat "$W/l.log"; exit 1; }
  [ -f "$W/l/checkpoints/step_000004/trainer_state.bin" ] || { echo "parallel.zero=1 did not write the legacy format"; exit 1; }
  local L=("$TETRAD" train "${T[@]}" "${Z[@]}" --set run.dir="$W/l" --set train.max_steps=6 --resume)
  # The legacy format as written now: compared like the sharded one.
  refused "legacy checkpoint, another train.seed" "train.seed: checkpoint 1337, config 7" "${L[@]}" --set train.seed=7
  refused "legacy checkpoint, other data" "the training data: checkpoint" "${L[@]}" --set data.dir="$W/data2"
  refused "legacy checkpoint, another tokenizer" "the token ids would mean other text" \
    "${L[@]}" --set data.dir="$W/data3" --allow-data-change
  # As older tetrads wrote it: no data record (data_epoch, data_cursor and the configuration).
  cp -r "$W/l" "$W/l_old"
  local c
  for c in "$W"/l_old/checkpoints/step_*; do $OLD state "$c" data || bad "old_checkpoint.py state $c"; done
  "$TETRAD" verify --model "$W/l_old" > /dev/null 2>&1 && ok "the old legacy checkpoint verifies" || bad "the old legacy checkpoint does not verify"
  local LO=("$TETRAD" train "${T[@]}" "${Z[@]}" --set run.dir="$W/l_old" --set train.max_steps=6 --resume)
  refused "old legacy checkpoint, another train.seed (from its recorded configuration)" \
    "train.seed: checkpoint (as in the configuration it recorded) 1337, config 7" "${LO[@]}" --set train.seed=7
  refused "old legacy checkpoint, another tokenizer" "the token ids would mean other text" "${LO[@]}" --set data.dir="$W/data3"
  refused "old legacy checkpoint, another train.seq_len" "was trained with train.seq_len = 32 but the config has 16" \
    "${LO[@]}" --set train.seq_len=16
  cp -r "$W/l_old" "$W/l_old2"
  works "old legacy checkpoint, the same settings" "${LO[@]}"
  [ "$(grep -c "does not record" "$W/out")" -eq 1 ] && grep -q "does not record the training data (no fingerprint of its shards; this run reads data.dir '$W/data', the folder the run was configured with)" "$W/out" &&
    ok "what it cannot compare is said once: $(grep -o 'does not record.*' "$W/out" | cut -c1-90)..." || bad "the old checkpoint's missing fingerprint was not said once: $(grep -c 'does not record' "$W/out")"
  works "its next resume (a new checkpoint)" "$TETRAD" train "${T[@]}" "${Z[@]}" --set run.dir="$W/l_old" --set train.max_steps=8 --resume
  grep -q "does not record" "$W/out" && bad "the new checkpoint still lacks its data record"
  refused "and then another seed is refused" "train.seed: checkpoint 1337" \
    "$TETRAD" train "${T[@]}" "${Z[@]}" --set run.dir="$W/l_old" --set train.max_steps=10 --resume --set train.seed=9
  works "old legacy checkpoint on other data (cannot be compared: said)" "$TETRAD" train "${T[@]}" "${Z[@]}" \
    --set run.dir="$W/l_old2" --set train.max_steps=6 --resume --set data.dir="$W/data2"
  grep -qF "this run reads data.dir '$W/data2', the run was configured with '$W/data'" "$W/out" &&
    ok "the other data.dir is named" || bad "the other data.dir is not named"

  # The sharded format from before the seed and the fingerprint were kept.
  train_run "$W/s" 4
  for c in "$W"/s/checkpoints/step_*; do $OLD meta "$c" seed fingerprint || bad "old_checkpoint.py meta $c"; done
  local SO=("$TETRAD" train "${T[@]}" --set run.dir="$W/s" --set train.max_steps=6 --resume)
  refused "old sharded checkpoint, another train.seed (from the run's config.toml)" \
    "train.seed: checkpoint (as in $W/s/config.toml) 1337, config 7" "${SO[@]}" --set train.seed=7
  works "old sharded checkpoint, the same settings" "${SO[@]}"
  [ "$(grep -c "does not record" "$W/out")" -eq 1 ] && grep -q "does not record the training data (no fingerprint" "$W/out" &&
    ok "what it cannot compare is said once" || bad "the old sharded checkpoint's missing fingerprint was not said once"
  grep -q "resumed from $W/s/checkpoints/step_000004" "$W/out" || bad "did not resume from the old sharded checkpoint"
}

case_interrupted() {
  # import, export and report -o killed (SIGKILL) or stopped (SIGTERM, SIGINT) at random points,
  # into a new destination and over an existing one (--overwrite): the destination holds the old
  # complete output, the new complete output or (new) nothing, never a mixture; what a killed
  # command left beside it (DEST.tmp-XXXXXX) is marked unfinished and refused by readers, and the
  # next run of the command removes it (an empty one too) and succeeds. A stopped one removes
  # its unfinished output itself, says so and exits 128 + the signal (130, 143), as train and
  # prepare stop cleanly. Seeded delays (the seed is printed).
  # A model of 27 MB, so that the writing is a good part of each command's time.
  local M=(--set model.name=small --set model.vocab_size=512 --set model.n_layer=2)
  "$TETRAD" train "${T[@]}" "${M[@]}" --set run.dir="$W/r" --set train.max_steps=1 > "$W/out" 2>&1 &&
    "$TETRAD" train "${T[@]}" "${M[@]}" --set run.dir="$W/r2" --set train.max_steps=2 > "$W/out" 2>&1 ||
    { cat "$W/out"; exit 1; }
  local seed=${TETRAD_TEST_SEED:-$RANDOM}
  echo "seed $seed (TETRAD_TEST_SEED=$seed repeats these delays)"
  # The outputs: the old one (from r2) and the new one (from r), for each command; how long each
  # command takes uninterrupted sets the range of its delays (a little past the end).
  local -A took
  ms_of() { local t0; t0=$(date +%s%N); "$@" > /dev/null 2>&1 || return 1; echo $((($(date +%s%N) - t0) / 1000000)); }
  "$TETRAD" export --model "$W/r2" --out "$W/old/export" > /dev/null 2>&1 &&
    took[export]=$(ms_of "$TETRAD" export --model "$W/r" --out "$W/new/export") &&
    "$TETRAD" import --hf "$W/old/export" --out "$W/old/import" > /dev/null 2>&1 &&
    took[import]=$(ms_of "$TETRAD" import --hf "$W/new/export" --out "$W/new/import") &&
    "$TETRAD" report "$W/r2" -o "$W/old/report" > /dev/null 2>&1 &&
    took[report]=$(ms_of "$TETRAD" report "$W/r" -o "$W/new/report") || { echo "making the outputs failed"; exit 1; }
  echo "uninterrupted: export ${took[export]} ms, import ${took[import]} ms, report ${took[report]} ms"
  sum_of() { if [ -d "$1" ]; then tree_sum "$1"; elif [ -e "$1" ]; then md5sum < "$1"; fi; }
  local k=0 cmd sig mode n_old=0 n_new=0 n_none=0 n_left=0 n_sealed=0 n_empty=0 n_stopped=0
  for cmd in export import report; do
    for sig in KILL TERM; do
      for mode in new over; do
        for _ in 1 2 3 4; do
          local d; d=$(python3 -c "import random, sys; random.seed(int(sys.argv[1]) * 1000 + int(sys.argv[2])); print('%.3f' % (random.uniform(0.05, 1.1) * int(sys.argv[3]) / 1000))" "$seed" $k "${took[$cmd]}"); k=$((k + 1))
          # Half of the SIGTERM runs get SIGINT (Ctrl-C) instead.
          local s=$sig; [ $sig = TERM ] && [ $((k % 2)) -eq 1 ] && s=INT
          local D="$W/out_$cmd" name="$cmd $mode SIG$s at ${d}s"
          rm -rf "$W"/out_*
          [ $mode = over ] && cp -a "$W/old/$cmd" "$D"
          local ow=(); [ $mode = over ] && ow=(--overwrite)
          local C
          case $cmd in
            export) C=("$TETRAD" export --model "$W/r" --out "$D") ;;
            import) C=("$TETRAD" import --hf "$W/new/export" --out "$D") ;;
            report) C=("$TETRAD" report "$W/r" -o "$D") ;;
          esac
          "${C[@]}" "${ow[@]}" > "$W/out" 2>&1 & local pid=$!
          sleep "$d"; kill -$s $pid 2>/dev/null; wait $pid 2>/dev/null; local rc=$?
          if [ $s != KILL ] && grep -q "stopped by SIG$s" "$W/out"; then
            # Stopped by its handler: status 128 + the signal, its unfinished output removed.
            n_stopped=$((n_stopped + 1))
            local code=143; [ $s = INT ] && code=130
            [ $rc -eq $code ] || bad "$name: stopped with status $rc, expected $code"
            grep -q "was not touched" "$W/out" || bad "$name: the message does not say the destination was not touched: $(cat "$W/out")"
            ls -d "$D".tmp-* > /dev/null 2>&1 && bad "$name: stopped, but left $(ls -d "$D".tmp-*)"
          fi
          # The destination: old, new or nothing.
          local now; now=$(sum_of "$D")
          if [ -z "$now" ] && [ $mode = new ]; then n_none=$((n_none + 1))
          elif [ $mode = over ] && [ "$now" = "$(sum_of "$W/old/$cmd")" ]; then n_old=$((n_old + 1))
          elif [ $cmd = import ] && [ -n "$now" ] && "$TETRAD" verify --model "$D" > /dev/null 2>&1 &&
               [ "$(latest "$D")" = step_000000 ]; then n_new=$((n_new + 1))
          elif [ $cmd != import ] && [ "$now" = "$(sum_of "$W/new/$cmd")" ]; then n_new=$((n_new + 1))
          else bad "$name: the destination is neither the old nor the new output: $(ls -A "$D" 2>&1 | tr '\n' ' ')"; fi
          # What it left: marked and refused by readers, or (killed between marking it complete
          # and renaming it) a complete output.
          local t
          for t in "$D".tmp-*; do
            [ -e "$t" ] || continue
            n_left=$((n_left + 1))
            # Killed between making the folder and writing its mark (or, report, after moving
            # the page out): an empty folder, which no reader takes for output; the next run
            # removes it.
            if [ -z "$(ls -A "$t")" ]; then n_empty=$((n_empty + 1)); continue; fi
            if [ -e "$t/.tetrad-unfinished" ]; then
              if [ $cmd != report ]; then
                "$TETRAD" verify --model "$t" > "$W/v" 2>&1 && bad "$name: verify accepted the leftover $t"
                grep -q "is unfinished output" "$W/v" || bad "$name: the leftover $t is not refused as unfinished: $(head -c 300 "$W/v")"
                "$TETRAD" export --model "$t" --out "$W/x_$k" > "$W/v" 2>&1 && bad "$name: export read the leftover $t"
              fi
            else
              n_sealed=$((n_sealed + 1))
              [ $cmd = report ] && bad "$name: a report leftover without the mark: $(ls -A "$t")"
              [ $cmd != report ] && { "$TETRAD" verify --model "$t" > /dev/null 2>&1 || bad "$name: an unmarked leftover $t does not verify"; }
            fi
          done
          # The next run: removes the leftovers of the killed one and writes the new output.
          local again=(); [ -e "$D" ] && again=(--overwrite)
          if "${C[@]}" "${again[@]}" > "$W/out" 2>&1; then
            local rest; rest=$(ls -d "$D".tmp-* 2>/dev/null | while read -r t; do [ -e "$t/.tetrad-unfinished" ] || [ -z "$(ls -A "$t")" ] && echo "$t"; done)
            [ -z "$rest" ] || bad "$name: the next run left the marked or empty leftover(s) $rest"
            if [ $cmd = import ]; then "$TETRAD" verify --model "$D" > /dev/null 2>&1 || bad "$name: the next import does not verify"
            else [ "$(sum_of "$D")" = "$(sum_of "$W/new/$cmd")" ] || bad "$name: the next run's output differs from the new one"; fi
          else bad "$name: the next run failed: $(grep -m1 error "$W/out")"; fi
        done
      done
    done
  done
  ok "$k interrupted runs (import, export, report; SIGKILL, SIGTERM, SIGINT; new and --overwrite): destination old $n_old, new $n_new, none $n_none; $n_stopped stopped by their handler, leaving nothing; $n_left left something beside it ($n_sealed of those complete, unmarked; $n_empty an empty folder), every marked or empty one refused by readers and removed by the next run"
  [ $n_stopped -gt 0 ] || bad "no SIGTERM/SIGINT reached a command's handler: the clean stop was not tested"
  # An empty leftover (what a kill between making the folder and marking it leaves) is removed by
  # the next run of each command, saying so; a folder that is not empty and not marked stays.
  rm -rf "$W"/out_*
  for cmd in export import report; do
    local D="$W/out_$cmd"
    mkdir -p "$D.tmp-Ab3dEf" "$D.tmp-kept01" && echo x > "$D.tmp-kept01/file"
    case $cmd in
      export) works "export after an empty leftover" "$TETRAD" export --model "$W/r" --out "$D" ;;
      import) works "import after an empty leftover" "$TETRAD" import --hf "$W/new/export" --out "$D" ;;
      report) works "report after an empty leftover" "$TETRAD" report "$W/r" -o "$D" ;;
    esac
    if [ ! -e "$D.tmp-Ab3dEf" ] && grep -qF "removed the empty folder '$D.tmp-Ab3dEf'" "$W/out" && [ -f "$D.tmp-kept01/file" ]; then
      ok "$cmd removed the empty $D.tmp-Ab3dEf, saying so, and kept the unmarked one that holds a file"
    else bad "$cmd: the empty leftover: $(ls -d "$D".tmp-* 2>&1 | tr '\n' ' ')"; fi
  done
  [ $((n_left - n_sealed - n_empty)) -gt 0 ] || bad "no run was interrupted while writing (the delays missed every write): nothing was tested"
}

# timed FILE CMD...: runs CMD and writes "SECONDS MAX_RSS_KIB" to FILE; returns CMD's status.
# Python's resource module rather than /usr/bin/time, which a minimal Debian does not have.
timed() {
  python3 -c '
import resource, subprocess, sys, time
t = time.monotonic()
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write("%.2f %d\n" % (time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc if rc >= 0 else 128 - rc)' "$@"
}

case_model_size() {
  # A config.json with absurd sizes: every command that builds a model from it refuses before
  # allocating (in well under a second, with little memory), naming the sizes and the memory.
  train_run "$W/r" 2
  "$TETRAD" export --model "$W/r" --out "$W/hf" > /dev/null 2>&1 || { echo "export failed"; exit 1; }
  set_config() {  # set_config DIR KEY VALUE
    python3 -c "import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p)); c[sys.argv[2]]=int(sys.argv[3]); json.dump(c,open(p,'w'))" "$@"
  }
  local case key val
  for case in n_layer=1000000000 n_layer=100000 n_layer=1000000 n_embd=1073741824 vocab_size=200000000 n_positions=1000000000; do
    key=${case%=*}; val=${case#*=}
    rm -rf "$W/big"; cp -r "$W/hf" "$W/big"; set_config "$W/big" "$key" "$val"
    [ $key = n_embd ] && set_config "$W/big" n_head 1
    for cmd in "import --hf $W/big --out $W/imp" "generate --model $W/big -n 2" "logits --model $W/big --tokens 1,2 --out $W/l" \
               "export --model $W/big --out $W/exp" "eval --model $W/big --data $W/data --split train --batches 1"; do
      timed "$W/time" "$TETRAD" $cmd > "$W/out" 2>&1; local rc=$?
      read -r secs kb < <(tail -1 "$W/time")
      if [ $rc -eq 1 ] && grep -q "nothing was allocated" "$W/out" && [ "$kb" -lt 1000000 ]; then
        ok "$key=$val: ${cmd%% *} refused in $secs s, $((kb / 1024)) MiB ($(grep -o 'needs at least [^(]*\|at least [0-9.]* [GM]iB in 16-bit' "$W/out" | head -1))"
      else bad "$key=$val: ${cmd%% *}: status $rc, $secs s, $((kb / 1024)) MiB"; fi
    done
    [ ! -e "$W/imp" ] && [ ! -e "$W/exp" ] || bad "$key=$val: a refused command left output"
  done
  # Weights that could hold the parameters (a sparse file) but more than the machine's memory:
  # refused naming the memory there is.
  rm -rf "$W/big"; cp -r "$W/hf" "$W/big"; set_config "$W/big" n_layer 1000000
  truncate -s 200G "$W/big/model.safetensors"
  refused "a model larger than the machine's memory" "available (MemAvailable" "$TETRAD" import --hf "$W/big" --out "$W/imp"
  refused "generate of a model larger than the machine's memory" "available (" "$TETRAD" generate --model "$W/big" -n 2
  # The right sizes still work.
  works "import of the model as it was" "$TETRAD" import --hf "$W/hf" --out "$W/imp"
  works "generate with the model as it was" "$TETRAD" generate --model "$W/hf" -n 2
}

case_verify() {
  # verify checks what readers need besides the tensors: config.json and the tokenizer, of a run's
  # latest checkpoint and of an exported model folder; what it passes, generate can use.
  train_run "$W/r" 2
  "$TETRAD" export --model "$W/r" --out "$W/hf" > /dev/null 2>&1 || { echo "export failed"; exit 1; }
  works "verify a run" "$TETRAD" verify --model "$W/r"
  works "verify an exported model folder" "$TETRAD" verify --model "$W/hf"
  local ck=checkpoints/step_000002 what
  for what in "config.json deleted:config.json is missing" "config.json damaged:config.json is unusable" \
              "config.json of another model:n_layer: config.json 3" "tokenizer deleted:its tokenizer" \
              "tokenizer damaged:does not load"; do
    local name=${what%%:*} pat=${what#*:}
    rm -rf "$W/v"; cp -r "$W/r" "$W/v"
    case $name in
      "config.json deleted") rm "$W/v/$ck/config.json" ;;
      "config.json damaged") echo '{"model_type": "gpt2", "n_layer": ' > "$W/v/$ck/config.json" ;;
      "config.json of another model") sed -i 's/"n_layer": 2/"n_layer": 3/' "$W/v/$ck/config.json" ;;
      "tokenizer deleted") rm "$W/v/$ck/tokenizer.model" ;;
      "tokenizer damaged") echo garbage > "$W/v/$ck/tokenizer.model" ;;
    esac
    refused "verify a run, $name" "$pat" "$TETRAD" verify --model "$W/v"
    "$TETRAD" generate --model "$W/v" -n 2 > /dev/null 2>&1 && bad "$name: generate works, verify need not refuse"
  done
  for what in "config.json damaged:config.json is unusable" "weights truncated:weight files hold" "tokenizer damaged:does not load"; do
    local name=${what%%:*} pat=${what#*:}
    rm -rf "$W/hv"; cp -r "$W/hf" "$W/hv"
    case $name in
      "config.json damaged") echo '[1, 2' > "$W/hv/config.json" ;;
      "weights truncated") truncate -s 1000 "$W/hv/model.safetensors" ;;
      "tokenizer damaged") echo garbage > "$W/hv/tokenizer.model" ;;
    esac
    refused "verify a model folder, $name" "$pat" "$TETRAD" verify --model "$W/hv"
  done
  # Values that are not finite, in a state no checksum catches (the checksums written again, as
  # for a fault before the save): the weights or the AdamW moments of a run's checkpoint, the
  # weights of a model folder and of the previous checkpoint format (parallel.zero = 1). Refused
  # naming the tensor, its shape and its first bad element.
  local OLD="python3 $(dirname "${BASH_SOURCE[0]}")/old_checkpoint.py"
  for what in "params nan 130:weights: tensor transformer.wte.weight (shape [512, 64]) holds 1 value(s) that are not finite, the first at [2, 2] (nan)" \
              "params inf 0:weights: tensor transformer.wte.weight (shape [512, 64]) holds 1 value(s) that are not finite, the first at [0, 0] (inf)" \
              "adam_m nan 70:AdamW first moment (adam_m): tensor transformer.wte.weight (shape [512, 64]) holds 1 value(s) that are not finite, the first at [1, 6] (nan)" \
              "adam_v -inf 5:AdamW second moment (adam_v): tensor transformer.wte.weight (shape [512, 64]) holds 1 value(s) that are not finite, the first at [0, 5] (-inf)"; do
    local how=${what%%:*} pat=${what#*:}
    read -r array value at <<<"$how"
    rm -rf "$W/v"; cp -r "$W/r" "$W/v"
    $OLD poison "$W/v/$ck" "$value" 1 "$at" "$array" || bad "old_checkpoint.py poison $how"
    refused "verify a run, $value in $array" "checkpoint $W/v/$ck, $pat" "$TETRAD" verify --model "$W/v"
  done
  rm -rf "$W/hv"; cp -r "$W/hf" "$W/hv"
  poison "$W/hv/model.safetensors" transformer.h.1.mlp.c_fc.weight nan 3 7
  refused "verify a model folder, a NaN weight" \
    "checkpoint $W/hv, weights: tensor transformer.h.1.mlp.c_fc.weight (shape [64, 256]) holds 1 value(s) that are not finite, the first at [3, 7] (nan)" \
    "$TETRAD" verify --model "$W/hv"
  "$TETRAD" train "${T[@]}" --set parallel.zero=1 --set run.dir="$W/l" --set train.max_steps=2 \
    --set train.checkpoint_interval=2 > "$W/l.log" 2>&1 || { cat "$W/l.log"; exit 1; }
  [ -f "$W/l/$ck/trainer_state.bin" ] || { echo "parallel.zero=1 did not write the previous format"; exit 1; }
  works "verify a run of the previous checkpoint format" "$TETRAD" verify --model "$W/l"
  $OLD poison_legacy "$W/l/$ck" transformer.h.0.ln_1.weight inf 9 || bad "old_checkpoint.py poison_legacy"
  refused "verify a run of the previous checkpoint format, an inf weight" \
    "checkpoint $W/l/$ck, weights: tensor transformer.h.0.ln_1.weight (shape [64]) holds 1 value(s) that are not finite, the first at [9] (inf)" \
    "$TETRAD" verify --model "$W/l"
}

case_jsonl() {
  # JSON-lines documents of any length prepare (the tokenizer trainer gets pieces of long lines),
  # as the same text does from a .txt file; --skip-bad-lines skips a bad line, whatever its length.
  python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
long_doc = " ".join("word%d" % (i % 3000) for i in range(20000))  # about 150 KB, one line
with open(w + "/long.jsonl", "w") as f:
    f.write(json.dumps({"text": long_doc}) + "\n")
    for i in range(30): f.write(json.dumps({"text": "short document %d of the corpus" % i}) + "\n")
with open(w + "/long.txt", "w") as f:
    f.write(long_doc + "\n")
with open(w + "/bad.jsonl", "w") as f:
    f.write('{"text": "' + "x" * 20000 + ' broken\n')   # not JSON, and longer than 16 KB
    f.write("[1, 2]\n")
    for i in range(30): f.write(json.dumps({"text": "document %d" % i}) + "\n")
PY
  works "prepare a JSON-lines document of 150 KB" "$TETRAD" prepare --input "$W/long.jsonl" --out "$W/dl" --vocab-size 300 --val-fraction 0
  grep -q '"documents": 31' "$W/dl/meta.json" && ok "all 31 documents prepared" || bad "documents: $(grep documents "$W/dl/meta.json")"
  works "prepare the same text from a .txt file" "$TETRAD" prepare --input "$W/long.txt" --out "$W/dt" --vocab-size 300 --val-fraction 0
  refused "a bad line without --skip-bad-lines" "line 1 is not valid JSON" \
    "$TETRAD" prepare --input "$W/bad.jsonl" --out "$W/db" --vocab-size 300
  [ "$(wc -c < "$W/out")" -lt 2000 ] && ok "the message quotes the line briefly ($(wc -c < "$W/out") bytes)" || bad "the message is $(wc -c < "$W/out") bytes"
  works "--skip-bad-lines skips the long bad line" "$TETRAD" prepare --input "$W/bad.jsonl" --out "$W/db" --vocab-size 300 --skip-bad-lines
  grep -q "skipped 2 bad line(s)" "$W/out" && grep -q '"documents": 30' "$W/db/meta.json" &&
    ok "2 bad lines skipped, 30 documents prepared" || bad "skipping: $(grep skipped "$W/out")"
  works "train on the long-document data" "$TETRAD" train "${T[@]}" --set data.dir="$W/dl" --set run.dir="$W/r" --set train.max_steps=2
}

case_concurrent() {
  # Every command that writes, run twice at once on one target: one wins, the other exits 1 with a
  # clear message (or, for train, waits its turn refused by the lock), and what is there is whole.
  train_run "$W/r" 2
  "$TETRAD" export --model "$W/r" --out "$W/hf" > /dev/null 2>&1 || { echo "export failed"; exit 1; }
  local round name
  # two NAME PATTERN CHECK CMD...: CMD twice at once; one exits 0, the other 1 saying PATTERN;
  # then CHECK (a command) must succeed.
  two() {
    local name=$1 pat=$2 check=$3; shift 3
    "$@" > "$W/a.log" 2>&1 & local p1=$!
    "$@" > "$W/b.log" 2>&1 & local p2=$!
    wait $p1; local r1=$?; wait $p2; local r2=$?
    local loser=$W/b.log; [ $r1 -ne 0 ] && loser=$W/a.log
    # prepare replaces a data folder by design: one that finished before the other began is fine.
    if [ $((r1 + r2)) -eq 0 ] && [ "${name%% *}" = prepare ] && eval "$check"; then
      ok "$name: the two ran one after the other, both whole"
    elif [ $((r1 + r2)) -eq 1 ] && grep -q -- "$pat" "$loser" && eval "$check"; then
      ok "$name twice at once: one wrote, the other refused ($(grep -m1 -o 'error: .*' "$loser" | cut -c1-90)...)"
    else bad "$name twice at once: status $r1 and $r2; $(cat "$W/a.log" "$W/b.log" | grep -m2 error)"; fi
  }
  for round in 1 2 3; do
    rm -rf "$W/ex" "$W/im" "$W/rep.html" "$W/rn" "$W/dn"
    two "export --out (round $round)" "not replacing it\|appeared while" '"$TETRAD" verify --model "$W/ex" > /dev/null 2>&1' \
      "$TETRAD" export --model "$W/r" --out "$W/ex"
    two "import --out (round $round)" "appeared while\|already holds\|is in use" '"$TETRAD" verify --model "$W/im" > /dev/null 2>&1' \
      "$TETRAD" import --hf "$W/hf" --out "$W/im"
    two "report -o (round $round)" "already exists\|appeared" 'grep -q "</html>" "$W/rep.html"' \
      "$TETRAD" report "$W/r" -o "$W/rep.html"
    two "prepare --out (round $round)" "being prepared by another\|appeared\|not replacing" \
      '"$TETRAD" train "${T[@]}" --set data.dir="$W/dn" --set run.dir="$W/rn" --set train.max_steps=1 > /dev/null 2>&1' \
      "$TETRAD" prepare --input "$W/c.txt" --out "$W/dn" --vocab-size 300
    rm -rf "$W/rn"
    two "train on one run.dir (round $round)" "is in use\|already holds a trained run" '"$TETRAD" verify --model "$W/rn" > /dev/null 2>&1' \
      "$TETRAD" train "${T[@]}" --set run.dir="$W/rn" --set train.max_steps=2
  done
  ls -d "$W"/*.tmp-* 2>/dev/null | grep -q . && bad "temporary folders left: $(ls -d "$W"/*.tmp-*)"
}

case_wrong_type() {
  # Every reader given a file of the wrong kind: exit 1 with one clear message, no crash.
  train_run "$W/r" 2
  "$TETRAD" export --model "$W/r" --out "$W/hf" > /dev/null 2>&1 || { echo "export failed"; exit 1; }
  echo "just some text" > "$W/text.txt"
  local ck=$W/r/checkpoints/step_000002
  local cases=(
    "train: data.dir a checkpoint|$TETRAD train --set model.name=tiny --set data.dir=$ck --set run.dir=$W/x1 --set train.max_steps=1"
    "train: data.dir a text file|$TETRAD train --set model.name=tiny --set data.dir=$W/text.txt --set run.dir=$W/x2 --set train.max_steps=1"
    "train: --config a binary|$TETRAD train --config /bin/ls"
    "train: run.dir a text file|$TETRAD train --set model.name=tiny --set data.dir=$W/data --set run.dir=$W/text.txt --set train.max_steps=1"
    "train: run.init_from a data folder|$TETRAD train --set model.name=tiny --set data.dir=$W/data --set run.dir=$W/x3 --set run.init_from=$W/data"
    "prepare: --tokenizer a text file|$TETRAD prepare --input $W/c.txt --out $W/x4 --tokenizer $W/text.txt"
    "prepare: --tokenizer a checkpoint's shard|$TETRAD prepare --input $W/c.txt --out $W/x5 --tokenizer $ck/shard_00000.bin"
    "tokenize: --tokenizer a text file|$TETRAD tokenize --tokenizer $W/text.txt"
    "generate: --model a data folder|$TETRAD generate --model $W/data -n 2"
    "generate: --model a text file|$TETRAD generate --model $W/text.txt -n 2"
    "logits: --model a data folder|$TETRAD logits --model $W/data --tokens 1,2 --out $W/x7"
    "eval: --data a checkpoint|$TETRAD eval --model $W/r --data $ck"
    "eval: --data a text file|$TETRAD eval --model $W/r --data $W/text.txt"
    "eval: --model a data folder|$TETRAD eval --model $W/data --data $W/data"
    "export: --model a data folder|$TETRAD export --model $W/data --out $W/x8"
    "import: --hf a run folder|$TETRAD import --hf $W/r --out $W/x9"
    "import: --hf a data folder|$TETRAD import --hf $W/data --out $W/x10"
    "import: --hf a text file|$TETRAD import --hf $W/text.txt --out $W/x11"
    "verify: --model a data folder|$TETRAD verify --model $W/data"
    "verify: --model a text file|$TETRAD verify --model $W/text.txt"
    "report: a data folder|$TETRAD report $W/data -o $W/x12.html"
    "report: a text file|$TETRAD report $W/text.txt -o $W/x13.html"
  )
  local c
  for c in "${cases[@]}"; do
    local name=${c%%|*} cmd=${c#*|}
    $cmd > "$W/out" 2>&1; local rc=$?
    if [ $rc -eq 1 ] && grep -q "error" "$W/out" && ! grep -q "terminate called\|what():\|Segmentation\|Aborted" "$W/out" &&
       [ "$(wc -c < "$W/out")" -lt 3000 ]; then
      ok "$name: $(grep -m1 -o 'error: .*' "$W/out" | cut -c1-110)"
    else bad "$name: status $rc, $(wc -c < "$W/out") bytes: $(grep -m1 . "$W/out" | cut -c1-150)"; fi
  done
  # (A refused train leaves no run folder either.)
  local left; left=$(find "$W" -maxdepth 1 -name 'x*')
  [ -z "$left" ] && ok "the refused commands left nothing" || bad "refused commands left output: $left $(find $left | head)"
}

"case_$CASE"
[ $fails -eq 0 ] && echo "all $CASE checks passed" || echo "$fails $CASE check(s) failed"
[ $fails -eq 0 ]
