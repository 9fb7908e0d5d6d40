#!/usr/bin/env python3
"""Table and SVG plot of the memorization experiment (experiments/memorization.sh).

Reads OUT/{standard,goldfish}/extraction.json and val.txt; prints extraction per repetition count
for both losses and the held-out loss; writes OUT/extraction.svg. In quick mode, exits 1 unless the
standard model memorised its canaries more than the Goldfish model (token match summed over
canaries)."""
import json
import os
import sys


def load(out, loss):
    with open(os.path.join(out, loss, "extraction.json")) as f:
        rep = json.load(f)
    by_file = {}
    for d in rep["documents"]:
        by_file[os.path.basename(d["name"])] = d
    with open(os.path.join(out, loss, "val.txt")) as f:
        val = float(f.read().split()[1])
    return by_file, val


def main():
    out, repeats, mode = sys.argv[1], [int(r) for r in sys.argv[2].split(",")], sys.argv[3]
    std, std_val = load(out, "standard")
    gf, gf_val = load(out, "goldfish")
    rows = []
    print(f"\nmemorization experiment ({mode}): extraction of canaries repeated R times")
    print(f"{'R':>4} | {'standard exact':>14} {'token match':>11} {'ROUGE-L':>7} | "
          f"{'goldfish exact':>14} {'token match':>11} {'ROUGE-L':>7}")
    for r in repeats:
        s, g = std[f"canary_r{r}.txt"], gf[f"canary_r{r}.txt"]
        rows.append((r, s, g))
        print(f"{r:>4} | {str(s['exact']):>14} {s['token_match']:>11.3f} {s['rouge_l']:>7.3f} | "
              f"{str(g['exact']):>14} {g['token_match']:>11.3f} {g['rouge_l']:>7.3f}")
    print(f"held-out loss: standard {std_val:.4f}, goldfish {gf_val:.4f} "
          f"({100 * (gf_val / std_val - 1):+.1f}%)")

    # SVG: token match rate against repetitions (log2 x axis), both losses.
    W, H, L, B = 480, 320, 60, 40
    xs = {r: L + (W - L - 20) * i / max(1, len(repeats) - 1) for i, r in enumerate(repeats)}
    y = lambda v: H - B - (H - B - 20) * v
    def line(idx, color):
        pts = " ".join(f"{xs[row[0]]:.1f},{y(row[idx]['token_match']):.1f}" for row in rows)
        return f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>'
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<line x1="{L}" y1="{y(0)}" x2="{W-20}" y2="{y(0)}" stroke="black"/>',
           f'<line x1="{L}" y1="{y(0)}" x2="{L}" y2="{y(1)}" stroke="black"/>',
           line(1, "#d62728"), line(2, "#1f77b4"),
           f'<text x="{W/2}" y="{H-8}" text-anchor="middle">repetitions of the canary (R)</text>',
           f'<text x="14" y="{H/2}" transform="rotate(-90 14 {H/2})" text-anchor="middle">suffix token match rate</text>',
           f'<text x="{L+10}" y="20" fill="#d62728">standard loss</text>',
           f'<text x="{L+120}" y="20" fill="#1f77b4">Goldfish k=4, h=13</text>']
    for r in repeats:
        svg.append(f'<text x="{xs[r]}" y="{y(0)+16}" text-anchor="middle">{r}</text>')
    for v in (0, 0.5, 1):
        svg.append(f'<text x="{L-6}" y="{y(v)+4}" text-anchor="end">{v}</text>')
    svg.append("</svg>")
    with open(os.path.join(out, "extraction.svg"), "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"plot: {os.path.join(out, 'extraction.svg')}")

    std_total = sum(s["token_match"] for _, s, _ in rows)
    gf_total = sum(g["token_match"] for _, _, g in rows)
    if mode == "quick" and not std_total > gf_total:
        print(f"FAIL: standard token match {std_total:.3f} is not above Goldfish {gf_total:.3f}")
        sys.exit(1)
    print(f"token match summed over canaries: standard {std_total:.3f}, goldfish {gf_total:.3f}")


if __name__ == "__main__":
    main()
