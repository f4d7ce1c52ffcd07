"""Conversations table from benches/conversations.sh results: per workload and arm, median over
runs of the turns' SLO attainment and the share of prompt tokens served from cache at each
conversation rate, and the highest rate at 95% attainment (linear between measured rates)."""
import collections
import json
import sys

import tables
from tables import med

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
att = collections.defaultdict(list)
cached = collections.defaultdict(list)
ttft = collections.defaultdict(list)
for row in rows:
    r = row["r"]
    key = (row["workload"], row["arm"], r["rate_rps"])
    att[key].append(r["slo_attainment"])
    cached[key].append(r.get("cached_share") or 0.0)
    ttft[key].append(r.get("ttft_p90_s") or float("nan"))
workloads = list(dict.fromkeys(row["workload"] for row in rows))
arms = list(dict.fromkeys(row["arm"] for row in rows))
rates = sorted({k[2] for k in att})
runs = len({row["run"] for row in rows})


def at95(workload, arm):
    return tables.at95([(rate, med(att[(workload, arm, rate)])) for rate in rates])


print(f"Median of {runs} run(s). Per conversation arrival rate (4 turns each): the turns' SLO "
      "attainment (TTFT <= 1 s and per-user TPS >= 25), then the share of prompt tokens the "
      "pods reported served from their caches; last column: the highest rate at 95% attainment "
      "(linear between measured rates; an arm at 95% everywhere shows the top rate).\n")
head = " | ".join(f"{r:g}/s" for r in rates)
print(f"| workload | arm | {head} | cached {head} | rate at 95% |")
print("|---" * (2 * len(rates) + 3) + "|")
for w in workloads:
    for a in arms:
        if not any((w, a, r) in att for r in rates):
            continue
        at = " | ".join(f"{100 * med(att[(w, a, r)]):.1f}%" for r in rates)
        ca = " | ".join(f"{100 * med(cached[(w, a, r)]):.0f}%" for r in rates)
        print(f"| {w} | {a} | {at} | {ca} | {at95(w, a):.1f}/s |")
print()
