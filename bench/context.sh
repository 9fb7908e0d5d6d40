#!/usr/bin/env bash
# Issue 28's context-parallel benchmark, side by side in one run: the small configuration's width
# (6 layers, 512 hidden, 8 heads, vocabulary 8192) at sequences of 4096, 8192 and 16384 tokens,
# fp32 and bf16, one sequence per step, through `tetrad train`:
#   A: 1 rank x 2 threads (C = 1)      B: 2 ranks x 1 thread, --grid c=2, parallel.cp_comm = ring
# Per case it prints
#   - tokens/s of each (median over the steps after the first) and B / A (target >= 0.9);
#   - activation bytes per rank from the trainer's own allocation accounting (its memory line:
#     the activation buffer, plus the context exchange's buffers in B) and B / A (target <= 0.55);
#   - the peak resident memory of each rank (/usr/bin/time) against the memory formula's total
#     (parallel::model_memory, as `tetrad plan` reports it for the same run): how far the formula
#     that decides the longest sequence below is from a real run;
#   - the ring's exposed communication as a share of the step: the compute thread's waits on the
#     ring's sends and receives in `train --trace` (every step after the first on the timeline),
#     over those steps' time, mean of the two ranks.
# First (it needs no training) the longest sequence that trains in this machine's memory with
# C = 1 and with C = 2, from the memory formula (the trainer's memory fit check uses the same
# one): the largest multiple of 512 whose formula total fits MemTotal (C = 1: one rank has it all;
# C = 2 on this machine: the two ranks share it; C = 2 with a machine this size per rank); last,
# the formula's growth from the shortest sequence to the longest against the peak resident
# memory's (the process's baseline, which the formula does not count, cancels).
# docs/long-sequences.md has the columns and a run's table.
# Timings on a shared machine are noisy: the script prints the load average; compare side by
# side only.
#
#   bench/context.sh [TETRAD=build/tetrad] [SEQS="4096 8192 16384"] [PRECISIONS="fp32 bf16"]
#                    [STEPS=3] [OUT=bench-context.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
T=$(readlink -f "${1:-build/tetrad}")
SEQS=${2:-4096 8192 16384}
PRECISIONS=${3:-fp32 bf16}
STEPS=${4:-3}
OUT=$(readlink -f "${5:-bench-context.jsonl}")
[ "$STEPS" -ge 2 ] || { echo "STEPS must be at least 2 (the first is not timed)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# A corpus long enough for one 16K-token sequence a step (the tokens' content does not matter).
for i in $(seq 1 40000); do
  echo "the king went up to the city $i, and the people followed him to the river."
  [ $((i % 5)) -eq 0 ] && echo
done > "$W/c.txt"
"$T" prepare --input "$W/c.txt" --out "$W/data" --vocab-size 300 > /dev/null
: > "$OUT"
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $T"
echo "# small width (6 layers, 512 hidden, 8 heads), 1 sequence per step, $STEPS steps (first untimed), recompute none"

# run NAME PRECISION SEQ RANKS: one training run; leaves $W/NAME/{log,run,rss.*}.
run() {
  local name=$1 prec=$2 seq=$3 ranks=$4 d="$W/$1"
  rm -rf "$d"; mkdir -p "$d"
  local common=(train --set model.name=small --set model.max_seq="$seq" --set data.dir="$W/data"
    --set run.dir="$d/run" --set train.micro_batch=1 --set train.seq_len="$seq"
    --set train.max_steps="$STEPS" --set train.warmup_steps=1 --set train.eval_interval=0
    --set train.checkpoint_interval=0 --set train.log_interval=1 --set train.precision="$prec"
    --set train.recompute=none)
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=2 /usr/bin/time -f "%M" -o "$d/rss.0" "$T" "${common[@]}" --set train.threads=2 \
      > "$d/log" 2>&1 || { tail -20 "$d/log"; return 1; }
  else
    OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe --bind-to none \
      bash -c '/usr/bin/time -f "%M" -o "$0/rss.$OMPI_COMM_WORLD_RANK" "$@"' "$d" "$T" "${common[@]}" \
      --set train.threads=1 --grid c=2 --set parallel.cp_comm=ring \
      --trace "$d/run/trace.json" --trace-steps $((STEPS - 1)) > "$d/log" 2>&1 ||
      { tail -20 "$d/log"; return 1; }
  fi
}

# formula PRECISION SEQ GRID(1|c2) RANKS: the memory formula's total bytes per rank of that run,
# from `tetrad plan --json` on this machine's file with its memory per rank set very large (so
# the grid is listed whatever it needs); 0 if the plan lists no such grid.
sed 's/^per_rank_gb = .*/per_rank_gb = 1e9/' machines/local.toml > "$W/machine.toml"
formula() {
  "$T" plan --model small -s model.max_seq="$2" --machine "$W/machine.toml" --ranks "$4" \
    --seq "$2" --micro-batch 1 --global-batch 1 --precision "$1" --recompute none --cp-comm ring \
    --no-pipeline --top 0 --json "$W/plan.json" > /dev/null 2>&1 || { echo 0; return; }
  python3 - "$W/plan.json" "$3" <<'PY'
import json, sys
want = 2 if sys.argv[2] == "c2" else 1
for g in json.load(open(sys.argv[1]))["grids"]:
    if g["grid"]["c"] == want and all(g["grid"][a] == 1 for a in "xyzpd"):
        print(int(g["memory_bytes"]["total"])); break
else:
    print(0)
PY
}

# The longest sequence whose formula fits: the largest multiple of 512 with total <= budget.
mem_total=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
longest() {  # PRECISION GRID RANKS BUDGET
  local lo=512 hi=1048576 mid
  while [ $((hi - lo)) -gt 512 ]; do
    mid=$(( (lo + hi) / 2 / 512 * 512 ))
    local f; f=$(formula "$1" "$mid" "$2" "$3")
    if [ "$f" -gt 0 ] && [ "$f" -le "$4" ]; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}
echo
echo "# longest sequence in this machine's memory (MemTotal $((mem_total / 1048576)) MiB), memory formula, 1 sequence, recompute none"
printf "%-5s %10s %18s %22s\n" prec "C = 1" "C = 2 (this node)" "C = 2 (a node per rank)"
for prec in $PRECISIONS; do
  l1=$(longest "$prec" 1 1 "$mem_total")
  l2=$(longest "$prec" c2 2 $((mem_total / 2)))
  l2n=$(longest "$prec" c2 2 "$mem_total")
  printf "%-5s %10s %18s %22s\n" "$prec" "$l1" "$l2" "$l2n"
  echo "{\"precision\": \"$prec\", \"longest_c1\": $l1, \"longest_c2_this_node\": $l2, \"longest_c2_node_per_rank\": $l2n, \"mem_total\": $mem_total}" >> "$OUT"
done

printf "%-5s %6s | %9s %9s %6s | %9s %9s %6s | %14s %14s | %6s\n" prec seq "A tok/s" "B tok/s" "B/A" \
  "A act MiB" "B act MiB" "B/A" "A rss/formula" "B rss/formula" "ring%"
for seq in $SEQS; do
  for prec in $PRECISIONS; do
    run one "$prec" "$seq" 1
    run c2 "$prec" "$seq" 2
    fa=$(formula "$prec" "$seq" 1 1)
    fb=$(formula "$prec" "$seq" c2 2)
    python3 - "$W" "$prec" "$seq" "$fa" "$fb" "$OUT" <<'PY'
import glob, json, re, statistics, sys
W, prec, seq, fa, fb, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
def steps(d):
    rows = [json.loads(l) for l in open(f"{W}/{d}/run/metrics.jsonl") if '"step_time_s"' in l]
    return rows[1:]  # the first step is not timed
def tok_s(d):
    return seq / statistics.median(r["step_time_s"] for r in steps(d))
def act_bytes(d):
    # The trainer's memory line, per rank: activations X MiB [..., context exchange Y MiB].
    per = []
    for line in open(f"{W}/{d}/log"):
        m = re.search(r"activations ([0-9.]+) MiB", line)
        if not m or "memory: state" not in line: continue
        c = re.search(r"context exchange ([0-9.]+) MiB", line)
        per.append((float(m.group(1)) + (float(c.group(1)) if c else 0.0)) * 2**20)
    return max(per)
def rss(d):
    return max(int(open(f).read().split()[-1]) * 1024 for f in glob.glob(f"{W}/{d}/rss.*"))
def ring_share(d):
    t = json.load(open(f"{W}/{d}/run/trace.json"))
    ev = t["traceEvents"] if isinstance(t, dict) else t
    exposed, ranks = 0.0, set()
    for e in ev:
        if e.get("ph") != "X" or e.get("tid") != 0: continue
        ranks.add(e["pid"])
        if re.match(r"communication (send|recv)\b", e["name"]): exposed += e["dur"] * 1e-6
    step = sum(r["step_time_s"] for r in steps(d))
    return exposed / max(1, len(ranks)) / step
a, b = tok_s("one"), tok_s("c2")
aa, ab = act_bytes("one"), act_bytes("c2")
ra, rb = rss("one"), rss("c2")
share = ring_share("c2")
print(f"{prec:<5} {seq:6d} | {a:9.1f} {b:9.1f} {b / a:6.3f} | {aa / 2**20:9.1f} {ab / 2**20:9.1f} {ab / aa:6.3f} | "
      f"{ra / 2**20:6.0f}/{fa / 2**20:<7.0f} {rb / 2**20:6.0f}/{fb / 2**20:<7.0f} | {100 * share:5.1f}%", flush=True)
with open(out, "a") as f:
    f.write(json.dumps({"precision": prec, "seq": seq, "tok_s_1x2": a, "tok_s_c2": b, "tok_s_ratio": b / a,
                        "activation_bytes_1x2": aa, "activation_bytes_c2": ab, "activation_ratio": ab / aa,
                        "peak_rss_1x2": ra, "peak_rss_c2": rb, "formula_1x2": fa, "formula_c2": fb,
                        "ring_exposed_share": share}) + "\n")
PY
  done
done

# The formula against the real runs without the process's baseline (program, libraries, MPI,
# oneDNN's kernels, the token shards: what the formula does not count): the growth of the peak
# resident memory from the shortest sequence to the longest over the formula's growth.
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"seq"' in l]
for prec in sorted({r["precision"] for r in rows}):
    rs = sorted((r for r in rows if r["precision"] == prec), key=lambda r: r["seq"])
    if len(rs) < 2: continue
    lo, hi = rs[0], rs[-1]
    for k, name in (("1x2", "C = 1"), ("c2", "C = 2")):
        grow = hi["peak_rss_" + k] - lo["peak_rss_" + k]
        form = hi["formula_" + k] - lo["formula_" + k]
        print(f"# {prec} {name}: peak resident memory grew {grow / 2**20:.0f} MiB from {lo['seq']} to "
              f"{hi['seq']} tokens, the formula {form / 2**20:.0f} MiB ({grow / form:.3f}x)")
PY

