"""The zoo's table from benches/zoo.sh results: per drawn fleet and rate, each arm's goodput
(median over runs), headroom's over the best baseline's, and overall how many fleet-rate cells
headroom is at or above the best baseline (to within 5%) and its worst ratio. Seeds from 1001
are the held-out ones, shown apart.
Usage: python3 benches/zoo_table.py target/zoo/results.jsonl"""
import collections
import json
import statistics
import sys

BASELINES = ("round_robin", "least_inflight", "p2c_peak_ewma")
HEADROOM = ("headroom:queue", "headroom:best_effort")
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
good = collections.defaultdict(list)  # (seed, rate, arm) -> [goodput]
for row in rows:
    r = row["r"]
    if "goodput_rps" in r:
        good[(row["seed"], r["rate_rps"], row["arm"])].append(r["goodput_rps"])
cells = sorted({(s, rate) for s, rate, _ in good})
arms = [a for a in (*HEADROOM, *BASELINES) if any(k[2] == a for k in good)]


def med(seed, rate, arm):
    values = good.get((seed, rate, arm))
    return statistics.median(values) if values else None


ratios = collections.defaultdict(lambda: collections.defaultdict(list))  # held -> arm -> [ratio]
print("| seed | rate req/s | " + " | ".join(arms) + " | headroom ÷ best baseline (queue / best_effort) |")
print("|---" * (len(arms) + 3) + "|")
for seed, rate in cells:
    values = {a: med(seed, rate, a) for a in arms}
    best = max((values[a] for a in BASELINES if values.get(a) is not None), default=None)
    shown = []
    for arm in HEADROOM:
        if values.get(arm) is None or best is None:
            continue
        # Where no baseline serves anything, any goodput at all is no regret.
        ratio = values[arm] / best if best > 0 else (1.0 if values[arm] >= 0 else 0.0)
        ratios[seed >= 1001][arm].append(ratio)
        shown.append(f"{ratio:.2f}")
    cell = lambda v: "–" if v is None else f"{v:.2f}"
    print(f"| {seed} | {rate:g} | " + " | ".join(cell(values[a]) for a in arms) + f" | {' / '.join(shown)} |")
print()
for held, by_arm in sorted(ratios.items()):
    which = "held-out seeds (1001 and up)" if held else "seeds for tuning (below 1001)"
    for arm, rs in by_arm.items():
        at_least = sum(r >= 0.95 for r in rs)
        print(f"{which}, {arm}: at or above the best baseline (within 5%) in {at_least} of {len(rs)} "
              f"fleet-rate cells; worst {min(rs):.2f}x, median {statistics.median(rs):.2f}x")
