#!/usr/bin/env bash
# Cold start under load: a fresh gateway (no curve for any backend) in front of
# config/sim-fleet.yaml (benches/goodput-gateway.yaml: the interactive class queues for room,
# TTFT <= 1 s and per-user TPS >= 25), hit from its first second by open-loop Poisson traffic at
# RATE req/s (default 16: 80% of the 20 req/s one warm gateway holds at 99.7%, "Several
# replicas"), 64-token prompts and replies, for WINDOWS windows of WINDOW_S seconds (default 6 x
# 5 s). Each window is its own bench process, started on the window's boundary while the previous
# one's requests finish, and scored by arrival: SLO attainment (a 429 counts as missed) and the
# requests shed (429). Arms: `before` (BASELINE=path: a build whose cold backends take one
# request at a time until one completes) and `ramp` (this build: the slow start). Each run gives
# every arm a fresh simulator and gateway and the same arrivals (bench --seed). Writes the table
# into docs/benchmarks/routing.md between the coldstart markers (median over runs).
#
# Usage: BASELINE=path [BIN=path] benches/coldstart.sh [RUNS=3] [ARMS...]
#   RATE=16 WINDOWS=6 WINDOW_S=5
# Needs ports 8180, 9190 and 9101-9104 free. About 40 s per arm per run.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift $(( $# < 1 ? $# : 1 ))
arms=${*:-before ramp}
rate=${RATE:-16}
windows=${WINDOWS:-6}
window_s=${WINDOW_S:-5}
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
out=$PWD/target/coldstart
mkdir -p "$out"
rm -f "$out/results.jsonl"
source benches/procs.sh

for run in $(seq "$runs"); do
  for arm in $arms; do
    gw=$bin
    [ "$arm" = before ] && gw=${BASELINE:?the before arm needs BASELINE=path}
    "$gw" sim --config config/sim-fleet.yaml >/dev/null 2>&1 & pids+=($!)
    "$gw" serve --config benches/goodput-gateway.yaml >"$out/gateway-$arm.log" 2>&1 & pids+=($!)
    for _ in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:9190/admin/curves && break; sleep 0.2; done
    bench_pids=()
    for window in $(seq "$windows"); do
      "$bin" bench --url http://127.0.0.1:8180 --model llama-3.1-8b --prompt-tokens 64 \
        --max-tokens 64 --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 --rate "$rate" \
        --duration "$window_s" --seed "$((run * 100 + window))" --json 2>/dev/null |
        sed "s/^/{\"arm\":\"$arm\",\"run\":$run,\"window\":$window,\"r\":/; s/$/}/" >"$out/window-$window.jsonl" &
      bench_pids+=($!)
      sleep "$window_s"
    done
    wait "${bench_pids[@]}"
    cat "$out"/window-*.jsonl >>"$out/results.jsonl"
    rm -f "$out"/window-*.jsonl
    echo "run $run: $arm done" >&2
    stop
  done
done

python3 - "$out/results.jsonl" "$rate" "$window_s" >"$out/table.md" <<'PY'
import json, statistics, sys
path, rate, window_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip()]
arms = list(dict.fromkeys(r["arm"] for r in rows))
windows = sorted({r["window"] for r in rows})
runs = len({r["run"] for r in rows})
def cell(arm, w):
    mine = [r["r"] for r in rows if r["arm"] == arm and r["window"] == w]
    att = statistics.median(r["slo_attainment"] for r in mine)
    shed = statistics.median(r["errors"] for r in mine)
    return f"{100 * att:.1f}% ({shed:g})"
span = lambda w: f"{(w - 1) * window_s:g}-{w * window_s:g} s"
print(f"Median of {runs} run(s). A fresh gateway, open-loop {rate} req/s from its first second; per {window_s:g}-s window of arrivals: SLO attainment (TTFT <= 1 s and per-user TPS >= 25, a 429 counting as missed) and, in brackets, the requests shed (429).")
print()
print("| arm | " + " | ".join(span(w) for w in windows) + " |")
print("|---|" + "---|" * len(windows))
for arm in arms:
    print(f"| {arm} | " + " | ".join(cell(arm, w) for w in windows) + " |")
PY
cat "$out/table.md"
python3 benches/splice.py coldstart "$out/table.md"
