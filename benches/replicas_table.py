"""Replicas table from benches/replicas.sh results: per setup and total rate, the SLO attainment
over every replica's requests and the worst replica's (medians over runs), and the highest rate
at which attainment stays at 95% (linear between measured rates)."""
import collections
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
levels = collections.defaultdict(list)  # (setup, rate, run) -> [(requests, good, attainment)]
for row in rows:
    r = row["r"]
    n = r["requests"]
    att = r.get("slo_attainment") or 0.0
    levels[(row["setup"], row["total_rate"], row["run"])].append((n, att * n, att))
setups = list(dict.fromkeys(row["setup"] for row in rows))
rates = sorted({row["total_rate"] for row in rows})
runs = len({row["run"] for row in rows})
overall = collections.defaultdict(list)  # (setup, rate) -> [attainment over all requests]
worst = collections.defaultdict(list)    # (setup, rate) -> [worst replica's attainment]
for (setup, rate, run), reps in levels.items():
    total = sum(n for n, _, _ in reps)
    overall[(setup, rate)].append(sum(g for _, g, _ in reps) / total if total else 0.0)
    worst[(setup, rate)].append(min(a for n, _, a in reps if n > 0))
med = lambda xs: statistics.median(xs) if xs else float("nan")
names = {
    "one": "one gateway",
    "one-as-eight": "one gateway, the eight's very arrivals (worst: of the eight streams)",
    "four": "four, 40/30/20/10%",
    "four-cluster": "four, 40/30/20/10%, `cluster`",
    "eight": "eight, 30/20/15/10/10/5/5/5%",
    "eight-cluster": "eight, 30/20/15/10/10/5/5/5%, `cluster`",
    "one-cold": "one gateway, right after start",
    "eight-cold": "eight, right after start",
    "eight-cold-cluster": "eight, right after start, `cluster`",
}


def at95(setup):
    pts = [(rate, med(overall[(setup, rate)])) for rate in rates]
    best = 0.0
    for (r0, a0), (r1, a1) in zip([(0.0, 1.0)] + pts, pts):
        if a1 >= 0.95:
            best = r1
            continue
        if a0 >= 0.95:
            best = r0 + (r1 - r0) * (a0 - 0.95) / (a0 - a1)
        break
    return best


print(f"Median of {runs} run(s). SLO attainment (TTFT <= 1 s and per-user TPS >= 25, 64-token replies) over all requests at each total arrival rate, then the worst replica's; last column: highest rate at 95% attainment.")
print()
head = " | ".join(f"{r:g}/s" for r in rates)
print(f"| gateways in front of the fleet | {head} | worst replica {head} | rate at 95% |")
print("|---|" + "---|" * (2 * len(rates) + 1))
for setup in setups:
    def cell(table, r):
        xs = table[(setup, r)]
        if not xs or (table is worst and setup in ("one", "one-cold")):
            return "—"
        return f"{100 * med(xs):.1f}%"
    cells = " | ".join(cell(overall, r) for r in rates)
    worst_cells = " | ".join(cell(worst, r) for r in rates)
    rate95 = "—" if "cold" in setup else f"{at95(setup):.1f}/s"
    print(f"| {names.get(setup, setup)} | {cells} | {worst_cells} | {rate95} |")
