#!/usr/bin/env bash
# Issue 32's mixture-of-experts benchmark, side by side in one run on one CPU: the Mixtral-shaped
# model (tetrad's `mixtral-small`: 8 experts of width 1408, top 2, 4 layers of 512, 8 heads with
# 2 key/value heads, vocabulary 8192, batch 4 x 512) training in tetrad (`tetrad bench`, fp32 and
# bf16) against transformers' MixtralForCausalLM (bench/transformers_mixtral.py: eager and
# torch.compile, fp32 and bf16 autocast, the same threads) and against tetrad's dense model of
# the same active parameters (`mixtral-small-dense`: one SwiGLU MLP of width 2 x 1408), then
# E = 2 on 2 ranks x 1 thread against 1 rank x 2 threads (`tetrad train --grid d=2,e=2` on the
# same global batch). Prints every number, then the table as ratios against the issue's targets:
#   tetrad MoE / transformers' best mode >= 1.5
#   active-FLOP rate / the FMA peak (fp32) or the bf16 matrix peak (bf16) >= 0.65
#   tetrad MoE / tetrad dense of the same active parameters >= 0.8
#   E = 2 on 2 ranks / 1 rank x 2 threads >= 0.85
# The machine's load average is printed before and after: on a shared machine only the ratios
# inside one run mean anything.
#   bench/moe.sh [TETRAD=build/tetrad] [THREADS=2] [STEPS=3] [WARMUP=1]
# VENV (environment): the Python with torch and transformers 5 (default $TETRAD_HF_VENV,
# /tmp/tetrad-hf5, .venv-pytorch: the first that imports both); ANCHOR=none skips it.
# MODES (default eager,compile), E2=0 skips the E = 2 run (it needs data/kjv or DATA=folder with
# an 8192-token tokenizer, `tetrad prepare`).
set -euo pipefail
cd "$(dirname "$0")/.."
TETRAD=$(readlink -f "${1:-build/tetrad}"); T="${2:-2}"; STEPS="${3:-3}"; WARMUP="${4:-1}"
MODES="${MODES:-eager,compile}"
W=$(mktemp -d /tmp/tetrad_moe_bench.XXXXXX); trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores; $(lscpu | grep -o -E 'amx_bf16|avx512_bf16' | sort -u | tr '\n' ' '))"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- tetrad: the MoE and the dense model of the same active parameters ----------------------------
for prec in fp32 bf16; do
  "$TETRAD" bench --configs mixtral-small,mixtral-small-dense --precision "$prec" --threads "$T" \
    --steps "$STEPS" --warmup "$WARMUP" --anchor none --json "$W/tetrad.$prec.json" \
    > "$W/tetrad.$prec.log" 2>&1 || { tail -20 "$W/tetrad.$prec.log"; exit 1; }
  grep -E "^== |tokens/s|FMA peak|bf16 peak|model FLOP" "$W/tetrad.$prec.log" | sed "s/^/  [tetrad $prec] /" | head -12
done

# ---- transformers ---------------------------------------------------------------------------------
PY=""
if [ "${ANCHOR:-}" != none ]; then
  for v in "${VENV:-}" "${TETRAD_HF_VENV:-}" /tmp/tetrad-hf5 .venv-pytorch; do
    [ -n "$v" ] && [ -x "$v/bin/python" ] && "$v/bin/python" -c 'import torch, transformers' 2>/dev/null &&
      { PY="$v/bin/python"; break; }
  done
  [ -n "$PY" ] || echo "no Python with torch and transformers (VENV=...): the anchor is skipped"
fi
if [ -n "$PY" ]; then
  for prec in fp32 bf16; do
    "$PY" bench/transformers_mixtral.py --threads "$T" --steps "$STEPS" --warmup "$WARMUP" \
      --precision "$prec" --modes "$MODES" > "$W/hf.$prec.json" 2> "$W/hf.$prec.log" ||
      { tail -5 "$W/hf.$prec.log"; exit 1; }
  done
  "$PY" bench/transformers_mixtral.py --dense --threads "$T" --steps "$STEPS" --warmup "$WARMUP" \
    --precision fp32 --modes eager > "$W/hf.dense.json" 2> "$W/hf.dense.log" ||
    { tail -5 "$W/hf.dense.log"; exit 1; }
fi

# ---- E = 2 on 2 ranks against one rank x 2 threads (the trainer, same global batch) --------------
DATA="${DATA:-data/kjv}"
if [ "${E2:-1}" != 0 ] && [ -f "$DATA/meta.json" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  train() {  # train NAME RANKS THREADS GRID
    local steps=$((STEPS + WARMUP))
    local cmd=("$TETRAD" train --set model.name=mixtral-small --set "data.dir=$DATA"
      --set train.precision=fp32 --set train.micro_batch=4 --set train.seq_len=512
      --set "train.max_steps=$steps" --set train.eval_interval=0 --set "run.dir=$W/$1"
      --set train.checkpoint_interval=0 --grid "$4" --overwrite)
    if [ "$2" = 1 ]; then OMP_NUM_THREADS=$3 "${cmd[@]}" > "$W/$1.log" 2>&1
    else mpirun --oversubscribe -n "$2" -x OMP_NUM_THREADS="$3" "${cmd[@]}" > "$W/$1.log" 2>&1; fi ||
      { tail -5 "$W/$1.log"; return 1; }
  }
  train e1 1 "$T" 1,1,1,1 && train e2 2 1 d=2,e=2 || echo "E = 2 run failed"
fi

python3 - "$W" "$WARMUP" <<'PY'
import glob, json, os, statistics, sys
W, warmup = sys.argv[1], int(sys.argv[2])
def rows(path):
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")] if os.path.exists(path) else []
tet = {p: {r["config"]: r for r in rows(f"{W}/tetrad.{p}.json") if "config" in r}
       for p in ("fp32", "bf16")}
hf = {p: (rows(f"{W}/hf.{p}.json") or [None])[-1] for p in ("fp32", "bf16", "dense")}
print("\n== tokens/s")
for p in ("fp32", "bf16"):
    for c in ("mixtral-small", "mixtral-small-dense"):
        r = tet[p].get(c)
        if r:
            print(f"  tetrad {c:20s} {p}: {r['tokens_per_s']:8.1f}  active {r['model_gflops']:.1f} GFLOP/s, "
                  f"{100 * r['mfu']:.1f}% of the {r['mfu_peak']} peak {r['mfu_peak_gflops']:.0f}, "
                  f"{100 * r['mfu_fma']:.1f}% of the FMA peak")
for p in ("fp32", "bf16", "dense"):
    h = hf[p]
    if not h:
        continue
    modes = ", ".join(f"{m} {v['tokens_per_s']:.1f}" if "tokens_per_s" in v else f"{m} failed"
                      for m, v in h["modes"].items())
    print(f"  transformers {h['model']} {h['precision']}: {modes} (torch {h['torch_version']}, "
          f"transformers {h['transformers_version']})")
best_hf = max([(v["tokens_per_s"], f"{h['precision']} {m}") for p in ("fp32", "bf16") if hf[p]
               for m, v in hf[p]["modes"].items() if "tokens_per_s" in v], default=None)
moe = {p: tet[p].get("mixtral-small") for p in ("fp32", "bf16")}
dense = {p: tet[p].get("mixtral-small-dense") for p in ("fp32", "bf16")}
best_p = max((p for p in moe if moe[p]), key=lambda p: moe[p]["tokens_per_s"], default=None)
print("\n== ratios (target)")
if best_hf and best_p:
    print(f"  tetrad MoE best ({best_p}) / transformers best ({best_hf[1]}): "
          f"{moe[best_p]['tokens_per_s'] / best_hf[0]:.2f}x  (>= 1.5)")
for p in ("fp32", "bf16"):
    if moe[p]:
        print(f"  tetrad MoE {p}: active FLOP rate / {moe[p]['mfu_peak']} peak: {moe[p]['mfu']:.2f}  (>= 0.65)")
for p in ("fp32", "bf16"):
    if moe[p] and dense[p]:
        print(f"  tetrad MoE / tetrad dense of the same active parameters, {p}: "
              f"{moe[p]['tokens_per_s'] / dense[p]['tokens_per_s']:.2f}  (>= 0.8)")
def train_tps(name):
    path = f"{W}/{name}/metrics.jsonl"
    v = [r["tokens_per_s"] for r in rows(path) if "tokens_per_s" in r and r.get("step", 0) > warmup]
    return statistics.median(v) if v else None
e1, e2 = train_tps("e1"), train_tps("e2")
if e1 and e2:
    print(f"  E = 2 on 2 ranks x 1 thread / 1 rank x 2 threads (train, fp32): {e2:.1f} / {e1:.1f} = "
          f"{e2 / e1:.2f}  (>= 0.85)")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
