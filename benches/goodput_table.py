"""Goodput table from benches/goodput.sh results: per policy, median over runs of interactive SLO
attainment and batch system TPS at each rate, and the highest rate at 95% attainment
(interpolated linearly between measured rates)."""
import collections
import json
import os
import sys

import tables
from tables import med

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
att = collections.defaultdict(list)    # (policy, rate) -> [attainment]
good = collections.defaultdict(list)   # (policy, rate) -> [goodput]
batch = collections.defaultdict(list)  # (policy, rate) -> [system tps]
for row in rows:
    r, key = row["r"], (row["policy"], row["r"]["rate_rps"])
    # Without a mix (benches/real-routing.sh) every request is interactive and scored.
    if r.get("class") == "interactive" or (r.get("class") is None and "slo_attainment" in r):
        att[key].append(r["slo_attainment"])
        good[key].append(r["goodput_rps"])
    elif r.get("class") == "batch":
        batch[key].append(r["system_tps"])
policies = list(dict.fromkeys(row["policy"] for row in rows))
rates = sorted({k[1] for k in att})
runs = len({row["run"] for row in rows})


def at95(policy):
    return tables.at95([(rate, med(att[(policy, rate)])) for rate in rates])


slo_tps = os.environ.get("SLO_TPS", "25")
slo_ttft_s = float(os.environ.get("SLO_TTFT_MS", "1000")) / 1000
print(f"Median of {runs} run(s). Interactive SLO attainment (TTFT <= {slo_ttft_s:g} s and "
      f"per-user TPS >= {slo_tps}) at each total arrival rate; batch = batch system tokens/s; "
      "last column: highest rate at 95% attainment (linear between measured rates; a policy at "
      "95% everywhere shows the top rate).\n")
head = " | ".join(f"{r:g}/s" for r in rates)
print(f"| policy | {head} | batch tok/s {head} | rate at 95% |")
print("|---" * (2 * len(rates) + 2) + "|")
for p in policies:
    a = " | ".join(f"{100 * med(att[(p, r)]):.1f}%" for r in rates)
    b = " | ".join(f"{med(batch[(p, r)]):.0f}" for r in rates)
    print(f"| {p} | {a} | {b} | {at95(p):.1f}/s |")
print()
print("Interactive goodput (requests a second that met both targets), median of runs:\n")
print(f"| policy | {head} |")
print("|---" * (len(rates) + 1) + "|")
for p in policies:
    g = " | ".join(f"{med(good[(p, r)]):.2f}" for r in rates)
    print(f"| {p} | {g} |")
print()
