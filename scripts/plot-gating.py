#!/usr/bin/env python3
"""Draws docs/gating.svg from a recorded `shardq-bench scale` sweep.

Two panels over dequeuers per shard: the claim statement's p99 (log scale,
the worst shard of a run) and completed jobs/s, gated vs ungated, medians of
the repeats. Standard library only.

Usage: scripts/plot-gating.py [SCALE_JSON] [OUT_SVG]
  (defaults: bench/results/round15/scale/scale.json, docs/gating.svg)
"""
import json
import math
import statistics
import sys
from collections import defaultdict

src = sys.argv[1] if len(sys.argv) > 1 else "bench/results/round15/scale/scale.json"
out = sys.argv[2] if len(sys.argv) > 2 else "docs/gating.svg"
data = json.load(open(src))

cells = defaultdict(lambda: {"p99": [], "jobs": []})
for run in data["runs"]:
    if run["kind"] != "sweep" or not run["ok"]:
        continue
    key = (run["mode"], run["shards"], run["dequeuers_per_shard"])
    cells[key]["p99"].append(max(s["p99"] for s in run["claim_statement_ms"]))
    cells[key]["jobs"].append(run["jobs_per_s"])

dequeuers = sorted({k[2] for k in cells})
series = sorted({(k[0], k[1]) for k in cells}, key=lambda s: (s[1], s[0]))
COLOURS = {"gated": "#1f77b4", "ungated": "#d62728"}

W, H = 860, 360
PANEL_W, PANEL_H = 330, 220
TOP = 50


def xpos(left, d):
    lo, hi = math.log(dequeuers[0]), math.log(dequeuers[-1])
    return left + 20 + (math.log(d) - lo) / (hi - lo) * (PANEL_W - 40)


def panel(left, title, metric, ylog, yticks, fmt):
    parts = [f'<text x="{left + PANEL_W / 2}" y="{TOP - 14}" text-anchor="middle" '
             f'font-size="14">{title}</text>',
             f'<rect x="{left}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" '
             f'fill="none" stroke="#000"/>']
    lo, hi = yticks[0], yticks[-1]

    def ypos(v):
        if ylog:
            f = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        else:
            f = (v - lo) / (hi - lo)
        return TOP + PANEL_H - f * PANEL_H

    for t in yticks:
        y = ypos(t)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + PANEL_W}" y2="{y:.1f}" '
                     f'stroke="#000" stroke-opacity="0.1"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'font-size="11">{fmt(t)}</text>')
    for d in dequeuers:
        x = xpos(left, d)
        parts.append(f'<text x="{x:.1f}" y="{TOP + PANEL_H + 16}" text-anchor="middle" '
                     f'font-size="11">{d}</text>')
    parts.append(f'<text x="{left + PANEL_W / 2}" y="{TOP + PANEL_H + 34}" '
                 f'text-anchor="middle" font-size="12">dequeuers per shard</text>')
    for mode, shards in series:
        pts = [(xpos(left, d), ypos(statistics.median(cells[(mode, shards, d)][metric])))
               for d in dequeuers if (mode, shards, d) in cells]
        dash = "" if shards == 1 else ' stroke-dasharray="6 4"'
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{COLOURS[mode]}" '
                     f'stroke-width="2.5"{dash}/>')
        for x, y in pts:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{COLOURS[mode]}"/>')
    return parts


svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
       f'viewBox="0 0 {W} {H}" font-family="sans-serif">',
       f'<rect width="{W}" height="{H}" fill="#fff"/>']
svg += panel(70, "claim statement p99, ms (log)", "p99", True,
             [10, 100, 1000, 10000], lambda t: f"{t:,}")
svg += panel(490, "completed jobs/s", "jobs", False,
             [0, 50000, 100000, 150000, 200000], lambda t: f"{t // 1000}k")
legend_y = H - 16
x = 150
for mode, shards in series:
    dash = "" if shards == 1 else ' stroke-dasharray="6 4"'
    label = f"{mode}, {shards} shard{'s' if shards > 1 else ''}"
    svg.append(f'<line x1="{x}" y1="{legend_y}" x2="{x + 28}" y2="{legend_y}" '
               f'stroke="{COLOURS[mode]}" stroke-width="2.5"{dash}/>')
    svg.append(f'<text x="{x + 34}" y="{legend_y + 4}" font-size="12">{label}</text>')
    x += 150
svg.append("</svg>")
open(out, "w").write("\n".join(svg) + "\n")
print(f"wrote {out} from {src}")
