#!/usr/bin/env python3
"""Tables of benches/rampup.sh: attainment per 10-second window and policy (steps.jsonl), and
how soon predictions come back after bursts (predicted-bursts.jsonl against predicted-steady.jsonl).

Usage: benches/rampup_table.py OUT_DIR
"""
import json
import os
import sys

LEVELS = 8  # occupancies compared after bursts
TOLERANCE = 0.10


def steps(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    windows = sorted({r["window"] for r in rows})
    cell = {(r["policy"], r["window"]): r["r"] for r in rows}
    print("Interactive SLO attainment per 10-second window (by arrival); rate in requests/s.\n")
    print("| window | " + " | ".join(str(w) for w in windows) + " |")
    print("|---|" + "---|" * len(windows))
    rates = [cell.get((policies[0], w), {}).get("rate_rps") for w in windows]
    print("| rate | " + " | ".join(f"{r:g}" if r is not None else "-" for r in rates) + " |")
    for p in policies:
        vals = []
        for w in windows:
            r = cell.get((p, w))
            a = r.get("slo_attainment") if r else None
            vals.append(f"{100 * a:.1f}" if a is not None else "-")
        print(f"| {p} | " + " | ".join(vals) + " |")
    # Goal: >= 95% from the second window after each step.
    print()
    for p in policies:
        misses, step_at = [], None
        for i, w in enumerate(windows):
            rate = rates[i]
            if i > 0 and rate != rates[i - 1]:
                step_at = i
            r = cell.get((p, w)) or {}
            a = r.get("slo_attainment")
            settled = step_at is None or i >= step_at + 1
            if settled and a is not None and a < 0.95:
                misses.append(f"window {w} ({100 * a:.1f}%)")
        print(f"- {p}: " + ("every window from the second after each step at >= 95%"
                            if not misses else "below 95% after settling: " + ", ".join(misses)))
    print()


def polls(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def bursts(out):
    bursty = polls(os.path.join(out, "predicted-bursts.jsonl"))
    steady = polls(os.path.join(out, "predicted-steady.jsonl"))
    if not bursty or not steady:
        print("(no predictions polled)")
        return
    end = steady[-1]["t"]
    tail = [p for p in steady if p["t"] >= end - 10] or steady[-1:]
    ref = [sorted(p["ttft_p50_s"][n] for p in tail)[len(tail) // 2] for n in range(LEVELS)]
    print("Predicted TTFT p50 (ms) at occupancies 1-8 once steady traffic starts, after three bursts,")
    print("against a gateway that saw only the steady traffic (median of its last 10 s).\n")
    print("| seconds into steady traffic | " + " | ".join(str(n + 1) for n in range(LEVELS)) + " |")
    print("|---|" + "---|" * LEVELS)
    print("| steady-only reference | " + " | ".join(f"{1e3 * v:.0f}" for v in ref) + " |")
    for mark in (0, 1, 2, 3, 5, 10, 20, 30):
        p = min(bursty, key=lambda p: abs(p["t"] - mark))
        print(f"| {p['t']:.1f} | " + " | ".join(f"{1e3 * v:.0f}" for v in p["ttft_p50_s"][:LEVELS]) + " |")
    settled = []
    for n in range(LEVELS):
        last_out = None
        for p in bursty:
            if abs(p["ttft_p50_s"][n] / ref[n] - 1) > TOLERANCE:
                last_out = p["t"]
        settled.append(last_out)
    print()
    end = bursty[-1]["t"]

    def when(s):
        if s is None:
            return "at once"
        return f"not within {end:.0f} s" if s >= end else f"{s + 0.5:.1f} s"

    print("Within 10% of the reference for good from: " + ", ".join(
        f"{n + 1}: {when(s)}" for n, s in enumerate(settled)))


def main():
    out = sys.argv[1]
    if os.path.exists(os.path.join(out, "steps.jsonl")):
        steps(os.path.join(out, "steps.jsonl"))
    if os.path.exists(os.path.join(out, "predicted-bursts.jsonl")):
        bursts(out)


if __name__ == "__main__":
    main()
