"""Overhead table from benches/overhead.sh results (medians over repetitions)."""
import collections
import json
import math
import statistics
import sys

def parsed(line):
    try:
        return json.loads(line)
    except ValueError:
        return None


rows = [r for l in open(sys.argv[1]) if (r := parsed(l))]
hz = float(sys.argv[2])
by = collections.defaultdict(list)  # (arm, kind) -> rows
for row in rows:
    by[(row["arm"], row["kind"])].append(row)
med = statistics.median
# pgo: tpsgate built by deploy/pgo-build.sh (profile-guided), the build the container ships.
ARMS = ("direct", "nginx", "bare", "tpsgate", "pgo")
PROXIES = ARMS[1:]


def value(row, field):
    r = row["r"]
    if field == "requests_per_s" and "duration_us" in r:  # wrk
        return r["requests"] / (r["duration_us"] / 1e6)
    if field in ("latency_p50_s", "latency_p99_s") and "p50_us" in r:
        return r["p50_us" if "p50" in field else "p99_us"] / 1e6
    return r.get(field)


def stat(arm, kind, field):
    vals = [v for r in by[(arm, kind)] if (v := value(r, field)) is not None]
    return med(vals) if vals else math.nan


def added(arm, kind, field):
    """Median over repetitions of (arm - direct) in the same repetition: against the direct run
    beside the arm's where there is one (the c≈16 streams), else the direct arm's own run."""
    baseline = by[(arm, kind + "-beside")] or by[("direct", kind)]
    direct = {r["rep"]: value(r, field) for r in baseline}
    vals = [value(r, field) - direct[r["rep"]] for r in by[(arm, kind)] if r["rep"] in direct]
    return med(vals) if vals else math.nan


def cpu_us(arm, kind, per):
    vals = []
    for r in by[(arm, kind)]:
        n = r["r"].get("content_events") if per == "chunk" else r["r"].get("requests")
        if n:
            vals.append(r["cpu_ticks"] / hz * 1e6 / n)
    return med(vals) if vals else math.nan


def us(s):
    return "–" if math.isnan(s) else f"{s * 1e6:.0f} µs"


def signed_us(s):
    return "–" if math.isnan(s) else f"{s * 1e6:+.0f} µs".replace("-", "−")


def ratio(a, b):
    # A ratio of a negative "added" (within the noise below zero) says nothing.
    return "–" if math.isnan(a) or math.isnan(b) or a <= 0 or b <= 0 else f"{a / b:.2f}×"


print("Medians over repetitions; \"added\" = arm − direct in the same repetition (c≈16 streams: "
      "against a direct run at the same time as the arm's, with arrivals of its own). "
      "Streams: `tpsgate sim` upstream, `tpsgate bench` client; non-stream: static upstream, wrk.\n")
print("| measure | direct | nginx | bare hyper | tpsgate | tpsgate (PGO) | tpsgate ÷ nginx | PGO ÷ nginx | goal |")
print("|---|---|---|---|---|---|---|---|---|")
lines = [
    ("stream c=1: TTFT p50", "stream-c1", "ttft_p50_s", None),
    ("stream c≈16 (open loop): TTFT p50", "stream-c16", "ttft_p50_s", "added ≤ 100 µs"),
    ("stream c≈16 (open loop): TTFT p99", "stream-c16", "ttft_p99_s", "added ≤ 500 µs"),
    ("stream c≈16 (open loop): chunk gap p99", "stream-c16", "chunk_gap_p99_s", "added ≤ 50 µs"),
    ("non-stream c=1: latency p50", "nonstream-c1", "latency_p50_s", "added ≤ 60 µs"),
    ("non-stream c=1: latency p99", "nonstream-c1", "latency_p99_s", None),
]
for label, kind, field, goal in lines:
    cells = [us(stat("direct", kind, field))]
    for arm in PROXIES:
        cells.append(f"{us(stat(arm, kind, field))} ({signed_us(added(arm, kind, field))})")
    an = added("nginx", kind, field)
    ratios = " | ".join(f"{ratio(added(a, kind, field), an)} added" for a in ("tpsgate", "pgo"))
    print(f"| {label} | {' | '.join(cells)} | {ratios} | {goal or ''} |")
rps = {a: stat(a, "nonstream-c32", "requests_per_s") for a in ARMS}
flag = lambda a: " ⚑" if rps[a] >= 0.9 * rps["direct"] else ""
print(f"| non-stream c=32: requests/s | {rps['direct']:.0f} | "
      + " | ".join(f"{rps[a]:.0f}{flag(a)}" for a in PROXIES)
      + f" | {ratio(rps['tpsgate'], rps['nginx'])} | {ratio(rps['pgo'], rps['nginx'])} | ≥ 0.8× nginx |")
print("| CPU per non-stream request (c=32) | – | "
      + " | ".join(f"{cpu_us(a, 'nonstream-c32', 'req'):.0f} µs" for a in PROXIES) + " | | | |")
print("| CPU per streamed chunk (c≈16, incl. its request's share) | – | "
      + " | ".join(f"{cpu_us(a, 'stream-c16', 'chunk'):.1f} µs" for a in PROXIES) + " | | | |")
fr = {a: (sum(r["r"]["frames"] for r in by[(a, "stream-c16")]),
          sum(r["r"]["content_events"] for r in by[(a, "stream-c16")])) for a in ARMS}
print("| stream c≈16: frames / content events | "
      + " | ".join(f"{fr[a][0]} / {fr[a][1]}" for a in ARMS) + " | | | no coalescing |")
for n in (1000, 9000):
    vals, runs = {}, 0
    for a in PROXIES:
        rs = [r["r"]["bytes_per_stream"] for r in by[(a, "idle")] if r["r"]["streams"] == n]
        vals[a] = f"{statistics.median(rs) / 1024:.1f} KiB" if rs else "–"
        runs = max(runs, len(rs))
    of = f", median of {runs}" if runs > 1 else ""
    print(f"| memory per idle stream ({n} open, fresh process{of}) | – | "
          + " | ".join(vals[a] for a in PROXIES) + " | | | ≤ 16 KiB |")
errors = sum(r["r"].get("errors", 0) + r["r"].get("non_2xx", 0) for r in rows if r["kind"].startswith("nonstream"))
steal = [r["r"] for r in rows if r["kind"] == "steal"]
if steal:
    s = steal[0]
    print(f"\nCPU steal during the run (time the hypervisor gave other guests): "
          f"{s['steal_ticks'] / hz / (s['seconds'] * s['cpus']) * 100:.0f}% of both cores.")
print(f"\n⚑ within 10% of direct: the upstream (or the client) may be the limit there. "
      f"Non-stream errors in all runs: {errors}.")
print()
