#!/usr/bin/env bash
# Checkpoint bandwidth against the disk's own, measured in the same run on the same folder:
#   dd: sequential write of the checkpoint's size (bs 8 MiB, conv=fsync) and read with the page
#       cache dropped for the file (iflag=nocache), 3 times each, median;
#   tetrad bench-checkpoint: sync save (write + fsync + metadata + rename), async save (time
#       training is blocked while simulated 50 ms steps go on), read back (cache dropped, every
#       chunk checksum verified), 3 times each, median. One rank uses all cores (as training
#       does: the snapshot copy runs on the training threads, idle meanwhile).
# Usage: bench/checkpoint.sh [MODEL (small)] [DIR (/work/tmp/tetrad-ckpt-bench)] [RANKS (1)]
# With RANKS > 1 the checkpoint is written by a 1,1,1,RANKS... grid under mpirun (x = RANKS).
set -euo pipefail
cd "$(dirname "$0")/.."
TETRAD=${TETRAD:-build/tetrad}
model=${1:-small}
dir=${2:-/work/tmp/tetrad-ckpt-bench}
ranks=${3:-1}
mkdir -p "$dir"
echo "# $(date -u +%FT%TZ) $(uname -n); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$ranks" -gt 1 ]; then
  out=$(mpirun --allow-run-as-root --oversubscribe -n "$ranks" -x OMP_NUM_THREADS=1 "$TETRAD" \
        bench-checkpoint --model-name "$model" --dir "$dir/run" --grid "$ranks,1,1,1" --repeats 3)
else
  out=$(OMP_NUM_THREADS=$(nproc) "$TETRAD" bench-checkpoint --model-name "$model" --dir "$dir/run" --repeats 3)
fi
echo "$out" | grep -v '^json: '
json=$(echo "$out" | sed -n 's/^json: //p')
bytes=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['bytes'])" "$json")
count=$(( (bytes + 8388607) / 8388608 ))
median() { sort -g | sed -n "$(( ($1 + 1) / 2 ))p"; }
now() { date +%s.%N; }
w=(); r=()
for i in 1 2 3; do
  rm -f "$dir/dd.bin"
  t0=$(now); dd if=/dev/zero of="$dir/dd.bin" bs=8M count=$count conv=fsync status=none; t1=$(now)
  w+=("$(python3 -c "print($count * 8388608 / 1e6 / ($t1 - $t0))")")
  dd if="$dir/dd.bin" iflag=nocache count=0 status=none
  t0=$(now); dd if="$dir/dd.bin" of=/dev/null bs=8M status=none; t1=$(now)
  r+=("$(python3 -c "print($count * 8388608 / 1e6 / ($t1 - $t0))")")
done
rm -f "$dir/dd.bin"
ddw=$(printf '%s\n' "${w[@]}" | median 3)
ddr=$(printf '%s\n' "${r[@]}" | median 3)
python3 - "$json" "$ddw" "$ddr" "${w[*]}" "${r[*]}" <<'PY'
import json, sys
j = json.loads(sys.argv[1]); ddw = float(sys.argv[2]); ddr = float(sys.argv[3])
print(f"dd sequential write {ddw:.0f} MB/s (runs: {sys.argv[4]}), read {ddr:.0f} MB/s (runs: {sys.argv[5]})")
print(f"checkpoint write {j['write_MBps']:.0f} MB/s = {100 * j['write_MBps'] / ddw:.0f}% of dd (target >= 70%)")
print(f"checkpoint read  {j['read_MBps']:.0f} MB/s = {100 * j['read_MBps'] / ddr:.0f}% of dd")
print(f"async save blocked training {j['async_blocked_s'] * 1000:.1f} ms = "
      f"{100 * j['async_blocked_fraction']:.1f}% of the sync save's {j['sync_save_s'] * 1000:.0f} ms (target < 10%)")
j.update({"dd_write_MBps": ddw, "dd_read_MBps": ddr, "write_fraction_of_dd": j['write_MBps'] / ddw,
          "read_fraction_of_dd": j['read_MBps'] / ddr})
print("json:", json.dumps(j))
PY
rm -rf "$dir/run"
