#!/usr/bin/env python3
"""Polls a gateway's /admin/curves and prints, one JSON line per poll, the TTFT and speed its
current model predicts for one more request at each occupancy up to 16 (the "predicted" rows).

Usage: benches/predictions.py ADMIN_URL BACKEND SECONDS [INTERVAL_S=0.5]
"""
import json
import sys
import time
import urllib.request


def main():
    admin, backend, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
    start = time.monotonic()
    while (now := time.monotonic() - start) <= seconds:
        try:
            with urllib.request.urlopen(f"{admin}/admin/curves", timeout=2) as r:
                curves = json.load(r)["curves"]
        except OSError:
            curves = []
        for c in curves:
            if c["backend"] == backend and c.get("predicted"):
                ttft = [round(p["ttft_p50_s"], 4) for p in c["predicted"]]
                print(json.dumps({"t": round(now, 2), "ttft_p50_s": ttft}), flush=True)
        time.sleep(max(0.0, interval - (time.monotonic() - start - now)))


if __name__ == "__main__":
    main()
