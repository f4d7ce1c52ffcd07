"""The scale table (benches/scale.sh) from its results.jsonl: one row per replica count, the
median over runs of each figure."""
import json
import statistics
import sys
from collections import defaultdict

by_count = defaultdict(list)
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        by_count[r["replicas"]].append(r)


def med(rows, f):
    values = [f(r) for r in rows]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


runs = max(len(rows) for rows in by_count.values())
print(f"Median of {runs} run(s).\n")
print("| replicas (emulated) | rounds/s achieved (target) | Redis CPU | Redis CPU per 1,000 rounds "
      "| Redis commands/s | bytes/s in + out, all | per replica | samples taken / shared per s "
      "| the real gateway's round p50 / p99 | its count = the sum, after | runs with sums exact |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for count in sorted(by_count):
    rows = by_count[count]
    target = count * 1000 / rows[0]["interval_ms"]
    rounds = med(rows, lambda r: r["rounds_per_s"])
    cpu = med(rows, lambda r: r["redis_cpu"])
    per_k = med(rows, lambda r: r["redis_cpu"] / r["rounds_per_s"] * 1000 if r["rounds_per_s"] else None)
    total = med(rows, lambda r: r["redis_bytes_in_per_s"] + r["redis_bytes_out_per_s"])
    per_replica = med(rows, lambda r: r["bytes_per_s_per_replica"])
    taken = med(rows, lambda r: r["samples_taken_per_s"])
    shared = med(rows, lambda r: r["samples_shared_per_s"])
    p50 = med(rows, lambda r: r["gateway_round_ms_p50"])
    p99 = med(rows, lambda r: r["gateway_round_ms_p99"])
    matched = [r["gateway_matched_after_ms"] for r in rows]
    match = ", ".join("never" if m is None else f"{m:.0f} ms" for m in matched)
    exact = sum(1 for r in rows if r["sums_match_held"])
    per_k_text = f"{per_k:.3f} s" if per_k is not None else "—"
    print(f"| {count:,} | {rounds:,.0f} ({target:,.0f}) | {cpu:.2f} core | {per_k_text} "
          f"| {med(rows, lambda r: r['redis_commands_per_s']):,.0f} | {total / 1e6:.1f} MB/s "
          f"| {per_replica / 1e3:.0f} KB/s | {taken:.0f} / {shared:.0f} "
          f"| {p50:.2f} / {p99:.2f} ms | {match} | {exact} of {len(rows)} |")
