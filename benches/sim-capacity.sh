#!/usr/bin/env bash
# Capacity of one simulator process on one core: concurrent streams and chunks per second.
#
# The sim runs on core 0 with one Tokio worker; `tpsgate bench` runs on core 1. A 40 ms decode
# step with no per-request cost and no prefill cost means STREAMS streams should each see
# 25 tok/s, i.e. STREAMS * 25 chunks/s in all. If the sim kept up, per-user TPS stays at 25.
#
# Usage: benches/sim-capacity.sh [STREAMS] [MAX_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
streams=${1:-2000}
tokens=${2:-256}
cargo build --release --quiet
bin=target/release/tpsgate

out=$(mktemp)
taskset -c 0 "$bin" --threads 1 sim --listen 127.0.0.1:0 --model m \
  --step-base-ms 40 --step-per-seq-ms 0 --max-batch 8192 --prefill-tokens-per-s 1e12 >"$out" 2>/dev/null &
sim=$!
trap 'kill $sim 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 50); do grep -q listening "$out" && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.:]*' "$out")

ticks() { awk '{print $14 + $15}' "/proc/$sim/stat"; }
tokens_emitted() { curl -s "$url/sim/stats" | sed 's/.*"tokens":\([0-9]*\).*/\1/'; }
hz=$(getconf CLK_TCK)

t0=$(date +%s.%N); c0=$(ticks); k0=$(tokens_emitted)
taskset -c 1 "$bin" --threads 1 bench --url "$url" --model m --concurrency "$streams" \
  --requests "$streams" --max-tokens "$tokens" --prompt-tokens 8 --json >"$out.bench"
t1=$(date +%s.%N); c1=$(ticks); k1=$(tokens_emitted)

python3 - "$out.bench" "$t0" "$t1" "$c0" "$c1" "$k0" "$k1" "$hz" "$streams" <<'PY'
import json, sys
bench = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
t0, t1, c0, c1, k0, k1, hz, streams = map(float, sys.argv[2:])
wall = t1 - t0
cpu = (c1 - c0) / hz / wall
print(f"streams={int(streams)} wall={wall:.1f}s sim_cpu={cpu*100:.0f}% of one core")
print(f"chunks/s (sim, whole run) = {(k1-k0)/wall:,.0f}")
print(f"per-user TPS p10/p50/p90 = {bench['per_user_tps_p10']:.2f}/{bench['per_user_tps_p50']:.2f}/{bench['per_user_tps_p90']:.2f} (ideal 25.00)")
print(f"system TPS (bench) = {bench['system_tps']:,.0f} (ideal {streams*25:,.0f}); errors = {bench['errors']}")
print(f"TTFT p50/p99 = {bench['ttft_p50_s']*1e3:.1f}/{bench['ttft_p99_s']*1e3:.1f} ms (ideal 40); chunk gap p99 = {bench['chunk_gap_p99_s']*1e3:.1f} ms")
PY
rm -f "$out.bench"
