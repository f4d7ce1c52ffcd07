"""Overhead table from benches/overhead.sh results (medians over repetitions)."""
import collections
import json
import statistics
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
hz = float(sys.argv[2])
by = collections.defaultdict(list)  # (arm, kind) -> rows
for row in rows:
    by[(row["arm"], row["kind"])].append(row)
med = statistics.median


def stat(arm, kind, field):
    vals = [r["r"][field] for r in by[(arm, kind)] if r["r"].get(field) is not None]
    return med(vals) if vals else float("nan")


def added(arm, kind, field):
    """Median over repetitions of (arm - direct) in the same repetition."""
    direct = {r["rep"]: r["r"][field] for r in by[("direct", kind)]}
    vals = [r["r"][field] - direct[r["rep"]] for r in by[(arm, kind)] if r["rep"] in direct]
    return med(vals) if vals else float("nan")


def cpu_us(arm, kind, per):
    vals = []
    for r in by[(arm, kind)]:
        n = r["r"]["content_events"] if per == "chunk" else r["r"]["requests"]
        if n:
            vals.append(r["cpu_ticks"] / hz * 1e6 / n)
    return med(vals) if vals else float("nan")


us = lambda s: f"{s * 1e6:.0f} µs"
print("Medians over repetitions; \"added\" = arm − direct in the same repetition.\n")
print("| measure | direct | nginx | tpsgate | tpsgate ÷ nginx | goal |")
print("|---|---|---|---|---|---|")
lines = [
    ("stream c=1: TTFT p50", "stream-c1", "ttft_p50_s", None),
    ("stream c=16: TTFT p50", "stream-c16", "ttft_p50_s", "added ≤ 100 µs"),
    ("stream c=16: TTFT p99", "stream-c16", "ttft_p99_s", "added ≤ 500 µs"),
    ("stream c=16: chunk gap p99", "stream-c16", "chunk_gap_p99_s", "added ≤ 50 µs"),
    ("non-stream c=1: latency p50", "nonstream-c1", "latency_p50_s", "added ≤ 60 µs"),
    ("non-stream c=1: latency p99", "nonstream-c1", "latency_p99_s", None),
]
for label, kind, field, goal in lines:
    d = stat("direct", kind, field)
    n, t = stat("nginx", kind, field), stat("tpsgate", kind, field)
    an, at = added("nginx", kind, field), added("tpsgate", kind, field)
    print(f"| {label} | {us(d)} | {us(n)} (+{us(an)}) | {us(t)} (+{us(at)}) | "
          f"{at / an if an > 0 else float('nan'):.2f}× added | {goal or ''} |")
rps = {a: stat(a, "nonstream-c32", "requests_per_s") for a in ("direct", "nginx", "tpsgate")}
flag = lambda a: " (within 10% of direct: the upstream may be the limit)" if rps[a] >= 0.9 * rps["direct"] else ""
print(f"| non-stream c=32: requests/s | {rps['direct']:.0f} | {rps['nginx']:.0f}{flag('nginx')} | "
      f"{rps['tpsgate']:.0f}{flag('tpsgate')} | {rps['tpsgate'] / rps['nginx']:.2f}× | ≥ 0.8× nginx |")
print(f"| CPU per non-stream request (c=32) | – | {cpu_us('nginx', 'nonstream-c32', 'req'):.0f} µs | "
      f"{cpu_us('tpsgate', 'nonstream-c32', 'req'):.0f} µs | | |")
print(f"| CPU per streamed chunk (c=16, incl. its request's share) | – | {cpu_us('nginx', 'stream-c16', 'chunk'):.1f} µs | "
      f"{cpu_us('tpsgate', 'stream-c16', 'chunk'):.1f} µs | | |")
fr = {a: (sum(r["r"]["frames"] for r in by[(a, "stream-c16")]), sum(r["r"]["content_events"] for r in by[(a, "stream-c16")])) for a in ("direct", "nginx", "tpsgate")}
print(f"| stream c=16: frames / content events | {fr['direct'][0]} / {fr['direct'][1]} | {fr['nginx'][0]} / {fr['nginx'][1]} | {fr['tpsgate'][0]} / {fr['tpsgate'][1]} | | no coalescing |")
for n in (1000, 9000):
    vals = {}
    for a in ("nginx", "tpsgate"):
        rs = [r["r"] for r in by[(a, "idle")] if r["r"]["streams"] == n]
        vals[a] = f"{rs[0]['bytes_per_stream'] / 1024:.1f} KiB" if rs else "–"
    print(f"| memory per idle stream ({n} open) | – | {vals['nginx']} | {vals['tpsgate']} | | ≤ 16 KiB |")
print()
