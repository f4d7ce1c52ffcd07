#!/usr/bin/env bash
# Goodput of every routing policy on the simulated fleet (config/sim-fleet.yaml behind
# benches/goodput-gateway.yaml): open-loop Poisson arrivals at rising rates, 80% interactive
# (128 output tokens; a request is good when its TTFT <= 1 s and its per-user TPS >= 25) and
# 20% batch (512 output tokens). Each policy gets a fresh simulator and gateway, a
# warm-up so that curves exist, then the measured rates. Run k offers every policy the same
# arrivals (bench --seed k), so that policies differ only by where they send them. Writes the
# table into BENCHMARKS.md between the goodput markers (median over runs).
#
# Usage: benches/goodput.sh [RUNS=3] [RATES=4,8,12] [DURATION_S=60] [POLICIES...]
# Needs ports 8180, 9190 and 9101-9104 free. About 4 minutes per policy per run (a request not
# done in 30 s counts as failed).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rates=${2:-4,8,12}
duration=${3:-60}
shift $(( $# < 3 ? $# : 3 ))
policies=${*:-headroom round_robin least_inflight p2c_peak_ewma lowest_ttft oracle}
cargo build --release --quiet
bin=target/release/tpsgate
out=target/goodput
mkdir -p "$out"
# Given policies re-measure just those: their old rows go, the others stay.
if [ $# -gt 0 ] && [ -f "$out/results.jsonl" ]; then
  for policy in $policies; do sed -i "/\"policy\":\"$policy\"/d" "$out/results.jsonl"; done
else
  rm -f "$out"/*.jsonl
fi
source benches/procs.sh
bench() { # extra args...
  "$bin" bench --url http://127.0.0.1:8180 --model llama-3.1-8b --prompt-tokens 64 \
    --max-tokens 128 --mix interactive=0.8,batch=0.2:512 --slo-tps 25 --slo-ttft-ms 1000 \
    --timeout 30 "$@" 2>/dev/null
}
for run in $(seq "$runs"); do
  for policy in $policies; do
    "$bin" sim --config config/sim-fleet.yaml >/dev/null 2>&1 & pids+=($!)
    sed "s/^  policy: headroom/  policy: $policy/" benches/goodput-gateway.yaml >"$out/gateway-$policy.yaml"
    "$bin" serve --config "$out/gateway-$policy.yaml" >"$out/gateway-$policy.log" 2>&1 & pids+=($!)
    sleep 1
    bench --rate 5 --duration 20 --seed "$((1000 + run))" --json >/dev/null   # warm-up: curves form
    bench --rate "$rates" --duration "$duration" --seed "$run" --json \
      | sed "s/^/{\"policy\":\"$policy\",\"run\":$run,\"r\":/; s/$/}/" >>"$out/results.jsonl"
    echo "run $run: $policy done" >&2
    stop
  done
done
python3 benches/goodput_table.py "$out/results.jsonl" >"$out/table.md"
cat "$out/table.md"
python3 benches/splice.py goodput "$out/table.md"
