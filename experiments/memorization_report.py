#!/usr/bin/env python3
"""Table and SVG plot of the memorization experiment (experiments/memorization.sh).

Reads OUT/{standard,goldfish}/extraction.json (canaries named canary_r<R>_<i>.txt),
extraction_train.json (ordinary training windows) and val.txt, and in the fine-tuning modes
OUT/base/ too (the model before fine-tuning); prints, per repetition count R, the fraction of
canaries extracted exactly, the mean token match and ROUGE-L for every run, the overall rates and
the held-out loss; writes OUT/extraction.svg (exact-extraction rate and token match against R,
every run).

Quick mode exits 1 unless the standard model memorised its canaries more than the Goldfish model
(token match summed over the planted canaries). Full mode also checks the expected result of
issue 8 (standard: at least half of the canaries extracted exactly; Goldfish: at most 5%;
held-out loss within 5% of the standard run) and says which parts hold; it exits 0 either way,
because a miss is a finding to report, not a broken script. The fine-tuning modes check that the
base model extracts no canary (exactly; token match at most 0.2), that standard fine-tuning
extracts at least half of the most repeated canaries and more canaries (exact count and token
match) than Goldfish, that fine-tuning lowered the held-out loss of the new corpus, and the
held-out loss tolerance; finetune-quick exits 1 if any but the last fails, finetune reports."""
import json
import os
import re
import sys


def load(out, loss):
    with open(os.path.join(out, loss, "extraction.json")) as f:
        rep = json.load(f)
    groups = {}
    for d in rep["documents"]:
        m = re.match(r"canary_r(\d+)(?:_\d+)?\.txt$", os.path.basename(d["name"]))
        if not m or d["skipped"]:
            continue
        groups.setdefault(int(m.group(1)), []).append(d)
    with open(os.path.join(out, loss, "val.txt")) as f:
        val = float(f.read().split()[1])
    train = None
    path = os.path.join(out, loss, "extraction_train.json")
    if os.path.exists(path):
        with open(path) as f:
            train = json.load(f)
    return groups, rep, val, train


def mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def stats(docs):
    return (mean([1.0 if d["exact"] else 0.0 for d in docs]), mean([d["token_match"] for d in docs]),
            mean([d["rouge_l"] for d in docs]))


FINETUNE = ("finetune-quick", "finetune")
COLORS = {"base": "#7f7f7f", "standard": "#d62728", "goldfish": "#1f77b4"}
LABELS = {"base": "base model (before fine-tuning)", "standard": "standard loss",
          "goldfish": "Goldfish k=4, h=13"}


def main():
    out, repeats, mode = sys.argv[1], [int(r) for r in sys.argv[2].split(",")], sys.argv[3]
    finetune = mode in FINETUNE
    names = (["base"] if finetune else []) + ["standard", "goldfish"]
    runs = {n: load(out, n) for n in names}  # name -> (groups, report, val loss, train windows)
    rows = []
    what = "fine-tuning" if finetune else "pretraining"
    rep0 = runs["standard"][1]
    print(f"\nmemorization experiment ({mode}, {what}): extraction of canaries repeated R times "
          f"(prefix {rep0['prefix_len']} tokens, greedy suffix {rep0['suffix_len']})")
    if finetune:
        print("R = 0: canaries never planted (what the corpus alone gives); base: the model before "
              "fine-tuning")
    head = f"{'R':>4} {'n':>3}"
    for n in names:
        head += f" | {n + ' exact':>14} {'token match':>11} {'ROUGE-L':>7}"
    print(head)
    for r in repeats:
        per = [stats(runs[n][0].get(r, [])) for n in names]
        rows.append((r, per))
        line = f"{r:>4} {len(runs['standard'][0].get(r, [])):>3}"
        for st in per:
            line += f" | {st[0]:>14.3f} {st[1]:>11.3f} {st[2]:>7.3f}"
        print(line)
    line = f"{'all':>4} {rep0['evaluated']:>3}"
    for n in names:
        rep = runs[n][1]
        line += f" | {rep['exact_rate']:>14.3f} {rep['token_match_rate']:>11.3f} {rep['rouge_l']:>7.3f}"
    print(line)
    if all(runs[n][3] for n in names):
        tr = [runs[n][3] for n in names]
        print(f"ordinary training text ({tr[0]['evaluated']} windows): exact "
              + " / ".join(f"{t['exact_rate']:.3f}" for t in tr) + ", token match "
              + " / ".join(f"{t['token_match_rate']:.3f}" for t in tr) + f" ({' / '.join(names)})")
    vals = {n: runs[n][2] for n in names}
    std_val, gf_val = vals["standard"], vals["goldfish"]
    dval = 100 * (gf_val / std_val - 1)
    print("held-out loss: " + ", ".join(f"{n} {vals[n]:.4f}" for n in names)
          + f" (goldfish against standard {dval:+.1f}%)")

    # SVG: exact-extraction rate (solid) and token match (dashed) against R, every run.
    W, H, L, B = 520, 340, 60, 44
    xs = {r: L + (W - L - 20) * i / max(1, len(repeats) - 1) for i, r in enumerate(repeats)}
    y = lambda v: H - B - (H - B - 40) * v
    def line(idx, k, color, dash):
        pts = " ".join(f"{xs[row[0]]:.1f},{y(row[1][idx][k]):.1f}" for row in rows)
        extra = ' stroke-dasharray="6 4"' if dash else ""
        dots = "".join(f'<circle cx="{xs[row[0]]:.1f}" cy="{y(row[1][idx][k]):.1f}" r="3" fill="{color}"/>'
                       for row in rows)
        return f'<polyline fill="none" stroke="{color}" stroke-width="2"{extra} points="{pts}"/>' + dots
    xlabel = ("repetitions of each canary in the fine-tuning data (R; 0: never planted)" if finetune
              else "repetitions of each canary in the training data (R)")
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{y(0)}" x2="{W-20}" y2="{y(0)}" stroke="black"/>',
           f'<line x1="{L}" y1="{y(0)}" x2="{L}" y2="{y(1)}" stroke="black"/>']
    for idx, n in enumerate(names):
        svg += [line(idx, 0, COLORS[n], False), line(idx, 1, COLORS[n], True)]
    svg += [f'<text x="{W/2}" y="{H-8}" text-anchor="middle">{xlabel}</text>',
            f'<text x="14" y="{H/2}" transform="rotate(-90 14 {H/2})" text-anchor="middle">rate</text>']
    x = L + 10
    for n in names:
        label = LABELS[n] if n != "base" else "base model"
        svg.append(f'<text x="{x}" y="16" fill="{COLORS[n]}">{label}</text>')
        x += 8 * len(label) + 12
    svg.append(f'<text x="{L+10}" y="32">solid: extracted exactly; dashed: suffix token match</text>')
    for r in repeats:
        svg.append(f'<text x="{xs[r]}" y="{y(0)+16}" text-anchor="middle">{r}</text>')
    for v in (0, 0.5, 1):
        svg.append(f'<text x="{L-6}" y="{y(v)+4}" text-anchor="end">{v}</text>')
    svg.append("</svg>")
    with open(os.path.join(out, "extraction.svg"), "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"plot: {os.path.join(out, 'extraction.svg')}")

    # Summed over the planted canaries (R > 0).
    def total(n):
        return sum(d["token_match"] for r, ds in runs[n][0].items() if r > 0 for d in ds)
    std_total, gf_total = total("standard"), total("goldfish")
    print(f"token match summed over the planted canaries: standard {std_total:.3f}, goldfish {gf_total:.3f}")
    if mode == "quick":
        if not std_total > gf_total:
            print(f"FAIL: standard token match {std_total:.3f} is not above Goldfish {gf_total:.3f}")
            sys.exit(1)
        return
    std_rep, gf_rep = runs["standard"][1], runs["goldfish"][1]
    if finetune:
        top = max(repeats)
        top_std = stats(runs["standard"][0].get(top, []))[0]
        base_rep = runs["base"][1]
        def exact_count(n):
            return sum(1 for r, ds in runs[n][0].items() if r > 0 for d in ds if d["exact"])
        std_exact, gf_exact = exact_count("standard"), exact_count("goldfish")
        checks = [("the base model extracts no canary exactly before fine-tuning",
                   base_rep["exact_rate"] == 0, f"{base_rep['exact_rate']:.3f}"),
                  ("the base model's token match on the canaries is at most 0.2",
                   base_rep["token_match_rate"] <= 0.2, f"{base_rep['token_match_rate']:.3f}"),
                  (f"standard fine-tuning extracts at least half of the R = {top} canaries exactly",
                   top_std >= 0.5, f"{top_std:.3f}"),
                  ("standard fine-tuning extracts more planted canaries exactly than Goldfish",
                   std_exact > gf_exact, f"{std_exact} against {gf_exact}"),
                  ("standard fine-tuning matches more canary tokens than Goldfish",
                   std_total > gf_total, f"{std_total:.3f} against {gf_total:.3f}"),
                  ("fine-tuning lowers the held-out loss of the new corpus (standard, Goldfish)",
                   std_val < vals["base"] and gf_val < vals["base"],
                   f"{vals['base']:.3f} -> {std_val:.3f}, {gf_val:.3f}"),
                  ("Goldfish held-out loss within 5% of the standard run", abs(dval) <= 5,
                   f"{dval:+.1f}%")]
    else:
        checks = [("standard loss extracts at least half of the canaries exactly",
                   std_rep["exact_rate"] >= 0.5, f"{std_rep['exact_rate']:.3f}"),
                  ("Goldfish loss extracts at most 5% exactly", gf_rep["exact_rate"] <= 0.05,
                   f"{gf_rep['exact_rate']:.3f}"),
                  ("held-out loss within 5% of the standard run", abs(dval) <= 5, f"{dval:+.1f}%")]
    print(f"expected result (issue {20 if finetune else 8}):")
    for what_, ok, got in checks:
        print(f"  {'holds' if ok else 'MISSED'}: {what_} ({got})")
    if mode == "finetune-quick":
        # The test's assertion: every check but the held-out-loss tolerance (a tiny model's
        # loss moves by more than 5% between runs of a few hundred steps).
        missed = [w for w, ok, _ in checks[:-1] if not ok]
        if missed:
            print("FAIL: " + "; ".join(missed))
            sys.exit(1)


if __name__ == "__main__":
    main()
