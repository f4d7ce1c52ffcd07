#!/usr/bin/env bash
# BENCHMARKS.md's pictures, redrawn from the benchmarks' output kept in docs/benchmarks/data/:
# goodput per policy (benches/goodput.sh), SLO attainment through the trace replays
# (benches/traces.sh) and the curves the gateway learned on the simulated fleet, with the
# class's SLO drawn on them (`tpsgate curves --from`, the dashboard's picture).
#
# Usage: benches/pictures.sh          draw from the kept data
#        benches/pictures.sh --fresh  first copy the latest runs' output from target/ into
#                                     docs/benchmarks/data/ (run the benchmarks first:
#                                     benches/goodput.sh 1 2,4,6,8,10,12 30 headroom
#                                     p2c_peak_ewma least_inflight round_robin, the same with
#                                     FLEET=noisy SLO_TPS=35 at 1,2,4,6, and WINDOW_S=5
#                                     benches/traces.sh 1 headroom prefix_hash round_robin
#                                     least_inflight)
set -euo pipefail
cd "$(dirname "$0")/.."
data=docs/benchmarks/data
if [ "${1:-}" = --fresh ]; then
  cp target/goodput/results.jsonl "$data/goodput-default.jsonl"
  cp target/goodput-noisy-35-1000/results.jsonl "$data/goodput-noisy.jsonl"
  cp target/traces/results.jsonl "$data/traces.jsonl"
  cp target/goodput/curves-headroom-1.json "$data/curves-default.json"
fi
python3 benches/pictures.py
[ -n "${BIN:-}" ] || cargo build --release --quiet
"${BIN:-target/release/tpsgate}" curves --from "$data/curves-default.json" \
  --svg docs/benchmarks/img/curves-default.svg
echo docs/benchmarks/img/curves-default.svg >&2
