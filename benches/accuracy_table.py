"""Reads `NAME PORT DIALECT JSON` lines from bench-accuracy.sh and prints bench vs /sim/truth."""
import json
import sys
import urllib.request

prompt, tokens = sys.argv[1], sys.argv[2]
print("| backend | dialect | c | per-user TPS p50 (truth) | error | TTFT p50 (truth) | error |")
print("|---|---|---|---|---|---|---|")
for line in sys.stdin:
    name, port, dialect, js = line.split(" ", 3)
    r = json.loads(js)
    c = r["concurrency"]
    url = f"http://127.0.0.1:{port}/sim/truth?prompt_tokens={prompt}&output_tokens={tokens}"
    t = json.load(urllib.request.urlopen(url))["points"][c - 1]
    tps, ttft = r["per_user_tps_p50"], r["ttft_p50_s"]
    want_tps, want_ttft = t["per_user_tps"], t["ttft_s"]
    print(
        f"| {name} | {dialect} | {c} | {tps:.2f} ({want_tps:.2f}) | {100 * (tps / want_tps - 1):+.1f}% "
        f"| {ttft * 1e3:.1f} ms ({want_ttft * 1e3:.1f} ms) | {(ttft - want_ttft) * 1e3:+.1f} ms |"
    )
