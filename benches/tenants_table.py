"""Noisy-neighbour table from benches/tenants.sh results: per setup, the median over runs of each
tenant's SLO attainment and goodput, and (tpm) the tokens tenant A used fleet-wide per minute
against its limit."""
import collections
import json
import sys

from tables import med

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
b_rate, a_rate = sys.argv[2], sys.argv[3]
by = collections.defaultdict(list)
for row in rows:
    by[row["setup"]].append(row)
runs = len({row["run"] for row in rows})
what = {
    "today": "first come first served (the build before fair lines), no limits",
    "fair": "weighted fair line by tokens, equal weights, no limits",
    "tpm": "four replicas with `cluster:`, A limited to its share in tokens per minute",
}
print(f"Median of {runs} run(s). Tenant B sends {b_rate} req/s (its share), tenant A {a_rate} "
      "req/s (three times its share); attainment: TTFT <= 1 s and per-user TPS >= 25, a 429 "
      "counting as missed.\n")
print("| setup | B attainment | B goodput | A attainment | A goodput | A tokens/min (limit) |")
print("|---|---|---|---|---|---|")
for setup, rs in by.items():
    tokens = "—"
    if setup == "tpm":
        used = med([r["a_tokens_per_min"] for r in rs])
        limit = rs[0]["a_tpm_limit"]
        tokens = f"{used:,.0f} ({limit:,}: {100 * used / limit:.0f}%)"
    print(f"| {setup}: {what.get(setup, setup)} "
          f"| {100 * med([r['b']['attainment'] for r in rs]):.1f}% "
          f"| {med([r['b']['goodput_rps'] for r in rs]):.2f}/s "
          f"| {100 * med([r['a']['attainment'] for r in rs]):.1f}% "
          f"| {med([r['a']['goodput_rps'] for r in rs]):.2f}/s | {tokens} |")
