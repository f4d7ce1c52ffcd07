#!/usr/bin/env bash
# Routing between two real engines nobody here wrote: `transformers serve` with continuous
# batching and `transformers serve` serving one request at a time, the same randomly initialised
# Llama on each (benches/tiny_llama.py; nothing is downloaded but the Python packages), behind
# one gateway. Open-loop Poisson arrivals at three rates, all interactive (64-token prompts,
# MAX_TOKENS replies), scored against two SLOs derived from the engines as measured here:
#   marginal     min_tps = the batching engine's median per-user speed at LOAD_C in flight
#   comfortable  min_tps = half of that
# both with a first token within TTFT_MS. Arms: a policy, or `policy:on_miss` (the class's
# `on_miss` is `queue` unless named). Each arm gets fresh engines (as when this was first seen on
# an H100, so that one arm's leftovers cannot slow the next; FRESH_ENGINES=0 starts them once for
# the whole script), each warmed by requests straight to it, a fresh gateway, a short warm-up,
# then the rates; run k offers every arm the same arrivals (bench --seed k), and starts at its
# k-th arm.
#
# Usage: benches/real-routing.sh [RUNS=3] [RATES=0.5,1,2] [DURATION_S=30] [ARMS...]
#   VENV=dir (default target/engine-venv; made with torch and transformers[serving] when missing)
#   DEVICE=cpu|cuda  HIDDEN=256 LAYERS=4 (the model)  DTYPE=auto  LOAD_C=4  TTFT_MS=1000
#   MAX_TOKENS=64  SLOS="comfortable marginal"  BIN=path (default: build target/release)
#   REQUEST_TIMEOUT_S=60 (a request not done by then is counted failed, and dropped)
#   WARMUP_S=10 (each arm's gateway first sees this long of the first rate, unscored)
#   SHARED=name (the `device:` both backends name; empty: none)  MEDIAN=tok/s (skip measuring)
#   PYTHON, TRANSFORMERS: the interpreter and the `transformers` command, where they are
#   installed already (then no venv is made)
# Needs ports 8301, 8302, 8390 and 9390 free. On two CPU cores, about 2 minutes per arm and
# run per SLO; there both engines and the gateway share the cores, and together they stream
# about 100-230 tokens a second (64-token replies: 2-3 requests a second), so the default rates
# stay under that (4, 8 and 16 req/s, tried first, overloaded every arm to 0-4%).
# benches/gpu-fleet.sh runs it on a GPU with a 1B model.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rates=${2:-0.5,1,2}
duration=${3:-30}
shift $(( $# < 3 ? $# : 3 ))
arms=${*:-headroom headroom:best_effort round_robin least_inflight p2c_peak_ewma}
venv=${VENV:-$PWD/target/engine-venv}
device=${DEVICE:-cpu}
hidden=${HIDDEN:-256}
layers=${LAYERS:-4}
dtype=${DTYPE:-auto}
load_c=${LOAD_C:-4}
ttft_ms=${TTFT_MS:-1000}
max_tokens=${MAX_TOKENS:-64}
request_timeout=${REQUEST_TIMEOUT_S:-60}
slos=${SLOS:-comfortable marginal}
out=${OUT:-$PWD/target/real-routing}
# Both engines run on this machine's one device (its cores, or its one GPU): the gateway is
# told so (`device:`), unless SHARED= is set empty.
shared=${SHARED-this-$device}
[ -n "$shared" ] || shared='null'
mkdir -p "$out"
if [ ! -x "$venv/bin/transformers" ] && [ -z "${TRANSFORMERS:-}" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch "transformers[serving]"
fi
python=${PYTHON:-$venv/bin/python}
serve_cmd=${TRANSFORMERS:-$venv/bin/transformers}
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
model=$out/model-$hidden-$layers
[ -f "$model/config.json" ] || "$python" benches/tiny_llama.py "$model" "$hidden" "$layers" "$device"
source benches/procs.sh

# Whether an engine answers its health check (python, not curl: a lent GPU machine has no curl).
healthy() { "$python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
  "http://127.0.0.1:$1/health" 2>/dev/null; }
engines() { # start both engines, wait until they answer
  local port engine pid
  "$serve_cmd" serve "$model" --device "$device" --dtype "$dtype" --port 8301 --continuous-batching \
    >"$out/engine-batching.log" 2>&1 & pids+=($!)
  "$serve_cmd" serve "$model" --device "$device" --dtype "$dtype" --port 8302 --no-continuous-batching \
    >"$out/engine-serial.log" 2>&1 & pids+=($!)
  for engine in batching:8301:${pids[-2]} serial:8302:${pids[-1]}; do
    IFS=: read -r engine port pid <<<"$engine"
    for _ in $(seq 300); do
      healthy "$port" && break
      if ! kill -0 "$pid" 2>/dev/null; then # it died: say why now, not after five minutes
        echo "the $engine engine exited while starting:" >&2; tail -30 "$out/engine-$engine.log" >&2; exit 1
      fi
      sleep 1
    done
    # Warmed, as an operator's readiness check would: a fresh `transformers serve` takes its
    # first answer 16 s (0.03-0.1 s after), which would otherwise be the first thing every
    # arm's router learns of it.
    "$bin" bench --url "http://127.0.0.1:$port" --model "$model" --prompt-tokens 64 --max-tokens 8 \
      --concurrency 1 --requests 2 --timeout 120 --json >/dev/null 2>&1 || true
    # Then some load: a fresh engine keeps speeding up over its first minutes of traffic
    # (the first arm of each run read slowest), which no arm should be charged for.
    "$bin" bench --url "http://127.0.0.1:$port" --model "$model" --prompt-tokens 64 --max-tokens 64 \
      --concurrency 4 --requests 24 --timeout 120 --json >/dev/null 2>&1 || true
  done
}
bench() { "$bin" bench --model tiny --prompt-tokens 64 --max-tokens "$max_tokens" --timeout "$request_timeout" "$@" --json 2>/dev/null; }

# The batching engine's median speed at LOAD_C in flight, straight to it (MEDIAN=tok/s: as
# given, to compare with an earlier run's SLOs).
if [ -n "${MEDIAN:-}" ]; then
  median=$MEDIAN
else
  engines
  "$bin" bench --url http://127.0.0.1:8301 --model "$model" --prompt-tokens 64 --max-tokens "$max_tokens" \
    --concurrency "$load_c" --requests 32 --timeout 60 --json 2>/dev/null >"$out/engine-speed.json"
  [ "${FRESH_ENGINES:-1}" = 0 ] || stop
  median=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["per_user_tps_p50"], 1))' "$out/engine-speed.json")
fi
echo "batching engine at $load_c in flight: median $median tok/s" >&2

for slo in $slos; do
  case $slo in
    marginal) min_tps=$median ;;
    comfortable) min_tps=$(python3 -c "print(round($median / 2, 1))") ;;
    *) echo "SLOS: comfortable, marginal" >&2; exit 2 ;;
  esac
  rm -f "$out/results-$slo.jsonl"
  [ "${FRESH_ENGINES:-1}" = 1 ] || [ ${#pids[@]} -gt 0 ] || engines
  for run in $(seq "$runs"); do
    # Each run starts at a different arm, so that none is always the first on the engines.
    read -ra order <<<"$arms"
    shift_by=$(( (run - 1) % ${#order[@]} ))
    for arm in "${order[@]:shift_by}" "${order[@]:0:shift_by}"; do
      policy=${arm%%:*}
      on_miss=queue
      [ "$policy" = "$arm" ] || on_miss=${arm#*:}
      [ "${FRESH_ENGINES:-1}" = 0 ] || engines
      cat >"$out/gateway-$slo-$arm.yaml" <<YAML
listen: {address: 127.0.0.1:8390}
admin: {listen: 127.0.0.1:9390}
backends:
  - {name: batching, url: http://127.0.0.1:8301, dialect: openai, models: {tiny: "$model"}, max_concurrency: 64, device: $shared}
  - {name: serial, url: http://127.0.0.1:8302, dialect: openai, models: {tiny: "$model"}, max_concurrency: 8, device: $shared}
classes:
  - {name: interactive, min_tps: $min_tps, max_ttft_ms: $ttft_ms, on_miss: $on_miss}
default_class: interactive
routing: {policy: $policy}
curves: {half_life_s: 60}
YAML
      # Every decision and the candidates it weighed, so that a run that collapses can be read
      # afterwards (a few lines a request).
      RUST_LOG=${RUST_LOG:-info,tpsgate::router=trace} "$bin" serve --config "$out/gateway-$slo-$arm.yaml" \
        >"$out/gateway-$slo-$arm-$run.log" 2>&1 & pids+=($!)
      sleep 1
      first=${rates%%,*}
      bench --url http://127.0.0.1:8390 --rate "$first" --duration "${WARMUP_S:-10}" --seed "$((1000 + run))" >/dev/null
      bench --url http://127.0.0.1:8390 --rate "$rates" --duration "$duration" --seed "$run" \
        --slo-tps "$min_tps" --slo-ttft-ms "$ttft_ms" \
        | sed "s/^/{\"policy\":\"$arm\",\"run\":$run,\"r\":/; s/$/}/" >>"$out/results-$slo.jsonl"
      echo "$slo ($min_tps tok/s) run $run: $arm done" >&2
      if [ "${FRESH_ENGINES:-1}" = 1 ]; then stop; else kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; fi
    done
  done
  [ "${FRESH_ENGINES:-1}" = 0 ] || stop
  SLO_TPS=$min_tps SLO_TTFT_MS=$ttft_ms python3 benches/goodput_table.py "$out/results-$slo.jsonl" \
    | tee "$out/table-$slo.md"
done
