#!/usr/bin/env python3
"""BENCHMARKS.md's pictures, drawn from the benchmarks' own output kept in docs/benchmarks/data/.

    python3 benches/pictures.py [--out DIR]   # (benches/pictures.sh also draws the curves)

- goodput-<fleet>.svg: interactive goodput against arrival rate, one line per policy, from
  benches/goodput.sh's results.jsonl (median over runs at each rate);
- traces-attainment.svg: SLO attainment per window through the trace replays, one line per
  arm, from benches/traces.sh's results.jsonl (run with WINDOW_S=5).

Standard library only, so that a fresh machine draws them. The output is deterministic: the same
data gives the same bytes, and a test checks that the committed pictures are the data's.
"""

import collections
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "benchmarks" / "data"
IMG = ROOT / "docs" / "benchmarks" / "img"

W, H = 640, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 170, 40, 48
COLOURS = {
    "headroom": "#0b72b9",
    "oracle": "#7f7f7f",
    "p2c_peak_ewma": "#e8842c",
    "least_inflight": "#3a9d4a",
    "round_robin": "#c43c3c",
    "lowest_ttft": "#8e5bb5",
    "prefix_hash": "#e8842c",
}
NAMES = {
    "headroom": "tpsgate (headroom)",
    "oracle": "oracle (true curves)",
    "p2c_peak_ewma": "p2c, peak EWMA",
    "least_inflight": "least in flight",
    "round_robin": "round robin",
    "lowest_ttft": "lowest TTFT",
    "prefix_hash": "prefix hash",
}


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def ticks(hi, n=5):
    """Round tick values from 0 to at least `hi`."""
    if hi <= 0:
        return [0, 1]
    raw = hi / n
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 10 ** -len(str(int(1 / raw)))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    out, v = [], 0.0
    while v < hi + step * 0.999:
        out.append(round(v, 6))
        v += step
    return out


def num(v):
    return f"{v:g}"


def chart(title, xlabel, ylabel, series, ymax=None, yfmt=num, note=""):
    """An SVG line chart: `series` is [(key, [(x, y), ...])], drawn in order."""
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    xt = ticks(max(xs))
    yt = ticks(ymax if ymax is not None else max(ys))
    x0, x1, y0, y1 = 0, xt[-1], 0, yt[-1]
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    px = lambda x: LEFT + (x - x0) / (x1 - x0) * pw
    py = lambda y: TOP + ph - (y - y0) / (y1 - y0) * ph
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{esc(title)}</text>',
    ]
    for v in yt:
        out.append(f'<line x1="{LEFT}" y1="{py(v):.1f}" x2="{LEFT + pw}" y2="{py(v):.1f}" stroke="#e4e7eb"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(v) + 4:.1f}" text-anchor="end" fill="#555">{esc(yfmt(v))}</text>')
    for v in xt:
        out.append(f'<text x="{px(v):.1f}" y="{TOP + ph + 16}" text-anchor="middle" fill="#555">{num(v)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="#888"/>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="#888"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 10}" text-anchor="middle">{esc(xlabel)}</text>')
    out.append(
        f'<text transform="translate(16 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">{esc(ylabel)}</text>'
    )
    for k, (key, pts) in enumerate(series):
        colour = COLOURS.get(key, "#333")
        width = 3 if key == "headroom" else 1.8
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="{width}"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 14 + 20 * k
        out.append(f'<line x1="{LEFT + pw + 14}" y1="{ly - 4}" x2="{LEFT + pw + 34}" y2="{ly - 4}" stroke="{colour}" stroke-width="{width}"/>')
        out.append(f'<text x="{LEFT + pw + 40}" y="{ly}">{esc(NAMES.get(key, key))}</text>')
    if note:
        out.append(f'<text x="{LEFT + pw + 14}" y="{TOP + ph}" fill="#555" font-size="11">{esc(note)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def rows(name):
    path = DATA / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def goodput(fleet, title):
    """Interactive goodput (good requests/s) against the offered rate, per policy."""
    by = collections.defaultdict(list)
    for row in rows(f"goodput-{fleet}.jsonl"):
        r = row["r"]
        if r.get("class") == "interactive":
            by[(row["policy"], r["rate_rps"])].append(r["goodput_rps"])
    policies = list(dict.fromkeys(p for p, _ in by))
    series = [
        (p, sorted((rate, statistics.median(v)) for (q, rate), v in by.items() if q == p))
        for p in policies
    ]
    runs = len({row["run"] for row in rows(f"goodput-{fleet}.jsonl")})
    note = f"median of {runs} run(s)" if runs > 1 else "one run"
    return chart(title, "offered rate, requests/s (80% interactive)", "interactive goodput, good req/s", series, note=note)


def traces():
    """SLO attainment per window of each trace replay, per arm."""
    out = {}
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for row in rows("traces.jsonl"):
        window = row["r"].get("window_s")
        # A window without requests (the Azure trace's gaps) has no attainment to draw.
        if window and "slo_attainment" in row["r"]:
            by[row["trace"]][(row["arm"], window[1])].append(row["r"]["slo_attainment"])
    for trace, cells in by.items():
        arms = list(dict.fromkeys(a for a, _ in cells))
        series = [
            (a, sorted((t, 100 * statistics.median(v)) for (b, t), v in cells.items() if b == a))
            for a in arms
        ]
        out[trace] = chart(
            f"The {trace.capitalize()} trace replayed: SLO attainment over time",
            "seconds into the replay (window end)",
            "requests meeting the SLO, %",
            series,
            ymax=100,
        )
    return out


def main():
    out = pathlib.Path(sys.argv[2]) if sys.argv[1:2] == ["--out"] else IMG
    out.mkdir(parents=True, exist_ok=True)
    pictures = {
        "goodput-default.svg": goodput(
            "default", "Goodput, simulated heterogeneous fleet (SLO 1 s TTFT, 25 tok/s)"
        ),
        "goodput-noisy.svg": goodput(
            "noisy", "Goodput, noisy engines, a marginal SLO (1 s TTFT, 35 tok/s)"
        ),
    }
    for trace, svg in traces().items():
        pictures[f"traces-{trace}.svg"] = svg
    for name, svg in pictures.items():
        (out / name).write_text(svg)
        print(out / name, file=sys.stderr)


if __name__ == "__main__":
    main()
