#!/usr/bin/env bash
# Drift: the goodput setup (benches/goodput-gateway.yaml, curve half-life cut to 20 s), a steady
# open-loop load, and mid-run the fastest batching backend (vllm-large) becomes half as fast
# (`POST /sim/params`, step_base_ms 13.5 -> 27, step_per_seq_ms 0.83 -> 1.66). Prints, per 10 s
# window, where interactive requests went and their SLO attainment: traffic should shift away
# within two half-lives (40 s) and attainment recover.
#
# Usage: benches/drift.sh [RATE=6]     (needs ports 8180, 9190, 9101-9104 free; about 3 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-6}
cargo build --release --quiet
bin=target/release/tpsgate
out=target/drift
mkdir -p "$out"
"$bin" sim --config config/sim-fleet.yaml >/dev/null 2>&1 & sim=$!
sed 's/^  half_life_s: 60/  half_life_s: 20/' benches/goodput-gateway.yaml >"$out/gateway.yaml"
"$bin" serve --config "$out/gateway.yaml" >"$out/gateway.log" 2>&1 & gw=$!
trap 'kill $sim $gw 2>/dev/null || true' EXIT
sleep 1
window() { # label
  "$bin" bench --url http://127.0.0.1:8180 --model llama-3.1-8b --prompt-tokens 64 --max-tokens 128 \
    --mix interactive=0.8,batch=0.2:512 --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 \
    --rate "$rate" --duration 10 --json 2>/dev/null | grep '"interactive"' | sed "s/^/$1 /"
}
{
  for i in 1 2 3; do window "before-$i"; done
  curl -s -X POST http://127.0.0.1:9101/sim/params -H 'content-type: application/json' \
    -d '{"engine":{"step_base_ms":27,"step_per_seq_ms":1.66}}' >/dev/null
  for i in 1 2 3 4 5 6; do window "after-$i"; done
} | tee "$out/windows.txt" | python3 -c '
import json, sys
print("| window | vllm-large share | interactive attainment | requests per backend |")
print("|---|---|---|---|")
for line in sys.stdin:
    label, doc = line.split(" ", 1)
    r = json.loads(doc)
    b = r.get("backends", {})
    share = b.get("vllm-large", 0) / max(1, sum(b.values()))
    attained = 100 * r["slo_attainment"]
    print(f"| {label} | {100*share:.0f}% | {attained:.1f}% | {b} |")
'
