#!/usr/bin/env python3
"""Table and SVG plot of the memorization experiment (experiments/memorization.sh).

Reads OUT/{standard,goldfish}/extraction.json (canaries named canary_r<R>_<i>.txt),
extraction_train.json (ordinary training windows) and val.txt; prints, per repetition count R,
the fraction of canaries extracted exactly, the mean token match and ROUGE-L for both losses, the
overall rates and the held-out loss; writes OUT/extraction.svg (exact-extraction rate and token
match against R, both losses).

Quick mode exits 1 unless the standard model memorised its canaries more than the Goldfish model
(token match summed over canaries). Full mode also checks the expected result of issue 8
(standard: at least half of the canaries extracted exactly; Goldfish: at most 5%; held-out loss
within 5% of the standard run) and says which parts hold; it exits 0 either way, because a miss
is a finding to report, not a broken script."""
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


def main():
    out, repeats, mode = sys.argv[1], [int(r) for r in sys.argv[2].split(",")], sys.argv[3]
    std, std_rep, std_val, std_train = load(out, "standard")
    gf, gf_rep, gf_val, gf_train = load(out, "goldfish")
    rows = []
    print(f"\nmemorization experiment ({mode}): extraction of canaries repeated R times "
          f"(prefix {std_rep['prefix_len']} tokens, greedy suffix {std_rep['suffix_len']})")
    print(f"{'R':>4} {'n':>3} | {'standard exact':>14} {'token match':>11} {'ROUGE-L':>7} | "
          f"{'goldfish exact':>14} {'token match':>11} {'ROUGE-L':>7}")
    for r in repeats:
        s, g = stats(std.get(r, [])), stats(gf.get(r, []))
        n = len(std.get(r, []))
        rows.append((r, s, g))
        print(f"{r:>4} {n:>3} | {s[0]:>14.3f} {s[1]:>11.3f} {s[2]:>7.3f} | "
              f"{g[0]:>14.3f} {g[1]:>11.3f} {g[2]:>7.3f}")
    print(f"{'all':>4} {std_rep['evaluated']:>3} | {std_rep['exact_rate']:>14.3f} "
          f"{std_rep['token_match_rate']:>11.3f} {std_rep['rouge_l']:>7.3f} | "
          f"{gf_rep['exact_rate']:>14.3f} {gf_rep['token_match_rate']:>11.3f} {gf_rep['rouge_l']:>7.3f}")
    if std_train and gf_train:
        print(f"ordinary training text ({std_train['evaluated']} windows): exact "
              f"{std_train['exact_rate']:.3f} / {gf_train['exact_rate']:.3f}, token match "
              f"{std_train['token_match_rate']:.3f} / {gf_train['token_match_rate']:.3f} "
              f"(standard / goldfish)")
    dval = 100 * (gf_val / std_val - 1)
    print(f"held-out loss: standard {std_val:.4f}, goldfish {gf_val:.4f} ({dval:+.1f}%)")

    # SVG: exact-extraction rate (solid) and token match (dashed) against R, both losses.
    W, H, L, B = 520, 340, 60, 44
    xs = {r: L + (W - L - 20) * i / max(1, len(repeats) - 1) for i, r in enumerate(repeats)}
    y = lambda v: H - B - (H - B - 40) * v
    def line(idx, k, color, dash):
        pts = " ".join(f"{xs[row[0]]:.1f},{y(row[idx][k]):.1f}" for row in rows)
        extra = ' stroke-dasharray="6 4"' if dash else ""
        dots = "".join(f'<circle cx="{xs[row[0]]:.1f}" cy="{y(row[idx][k]):.1f}" r="3" fill="{color}"/>'
                       for row in rows)
        return f'<polyline fill="none" stroke="{color}" stroke-width="2"{extra} points="{pts}"/>' + dots
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{y(0)}" x2="{W-20}" y2="{y(0)}" stroke="black"/>',
           f'<line x1="{L}" y1="{y(0)}" x2="{L}" y2="{y(1)}" stroke="black"/>',
           line(1, 0, "#d62728", False), line(1, 1, "#d62728", True),
           line(2, 0, "#1f77b4", False), line(2, 1, "#1f77b4", True),
           f'<text x="{W/2}" y="{H-8}" text-anchor="middle">repetitions of each canary in the training data (R)</text>',
           f'<text x="14" y="{H/2}" transform="rotate(-90 14 {H/2})" text-anchor="middle">rate</text>',
           f'<text x="{L+10}" y="16" fill="#d62728">standard loss</text>',
           f'<text x="{L+120}" y="16" fill="#1f77b4">Goldfish k=4, h=13</text>',
           f'<text x="{L+10}" y="32">solid: extracted exactly; dashed: suffix token match</text>']
    for r in repeats:
        svg.append(f'<text x="{xs[r]}" y="{y(0)+16}" text-anchor="middle">{r}</text>')
    for v in (0, 0.5, 1):
        svg.append(f'<text x="{L-6}" y="{y(v)+4}" text-anchor="end">{v}</text>')
    svg.append("</svg>")
    with open(os.path.join(out, "extraction.svg"), "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"plot: {os.path.join(out, 'extraction.svg')}")

    std_total = sum(d["token_match"] for ds in std.values() for d in ds)
    gf_total = sum(d["token_match"] for ds in gf.values() for d in ds)
    print(f"token match summed over canaries: standard {std_total:.3f}, goldfish {gf_total:.3f}")
    if mode == "quick":
        if not std_total > gf_total:
            print(f"FAIL: standard token match {std_total:.3f} is not above Goldfish {gf_total:.3f}")
            sys.exit(1)
        return
    checks = [("standard loss extracts at least half of the canaries exactly",
               std_rep["exact_rate"] >= 0.5, f"{std_rep['exact_rate']:.3f}"),
              ("Goldfish loss extracts at most 5% exactly", gf_rep["exact_rate"] <= 0.05,
               f"{gf_rep['exact_rate']:.3f}"),
              ("held-out loss within 5% of the standard run", abs(dval) <= 5, f"{dval:+.1f}%")]
    print("expected result (issue 8):")
    for what, ok, got in checks:
        print(f"  {'holds' if ok else 'MISSED'}: {what} ({got})")


if __name__ == "__main__":
    main()
