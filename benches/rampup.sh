#!/usr/bin/env bash
# Routing through rate steps and bursts, from a fresh gateway (issue "Real engines", item 4).
#
# Steps: config/sim-fleet.yaml behind benches/goodput-gateway.yaml, all interactive (64-token
# prompts and replies; good when TTFT <= 1 s and per-user TPS >= 25), open-loop Poisson arrivals
# whose rate follows SCHEDULE, one rate per 10-second window: each window is its own bench
# process, started on the window's boundary while the previous one's requests finish, so that
# load never pauses between windows. Attainment is scored per window (by arrival). Each policy
# gets a fresh simulator and gateway: no warm-up beyond the schedule's own first windows.
#
# Bursts: the same simulator's vllm-large alone behind a fresh gateway (512-token prompts, 64 ms
# of prefill each, so that stacked prefills make a queue; 128-token replies): three bursts of 8, 12 and 16
# near-simultaneous requests (open loop at 1,600/s for 5, 7.5 and 10 ms) 5 s apart, then steady
# traffic at concurrency 8 (eight one-at-a-time clients started 250 ms apart) for STEADY_S
# seconds, while the model's predicted TTFT at occupancies 1-8 is polled every 0.5 s (from the
# start of the steady traffic, which takes 2 s to reach 8). The reference is a second fresh gateway that saw only the
# steady traffic (its predictions over the run's last 10 s). Prints, per occupancy, when the
# prediction came back within 10% of the reference for good.
#
# Usage: benches/rampup.sh [POLICIES...]   (default: headroom p2c_peak_ewma)
#   SCHEDULE=2,2,2,18,18,18,18,18,18,2,2,2,18,18,18,18,18,18  STEADY_S=40  PARTS="steps bursts"
#   BIN=path (a build to measure instead of this checkout's; results go to target/rampup$OUT_SUFFIX)
# Needs ports 8180, 9190 and 9101-9104 free. About 4 minutes per policy and 2 for the bursts.
set -euo pipefail
cd "$(dirname "$0")/.."
policies=${*:-headroom p2c_peak_ewma}
schedule=${SCHEDULE:-2,2,2,18,18,18,18,18,18,2,2,2,18,18,18,18,18,18}
steady=${STEADY_S:-40}
parts=${PARTS:-steps bursts}
if [ -z "${BIN:-}" ]; then cargo build --release --quiet; fi
bin=${BIN:-$PWD/target/release/tpsgate}
out=$PWD/target/rampup${OUT_SUFFIX:-}
mkdir -p "$out"
source benches/procs.sh

up() { # gateway-config
  "$bin" sim --config config/sim-fleet.yaml >/dev/null 2>&1 & pids+=($!)
  "$bin" --log-format json serve --config "$1" >/dev/null 2>"$1.log" & pids+=($!)
  for _ in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:9190/admin/curves && break; sleep 0.2; done
  sleep 0.5
}

if [[ " $parts " == *" steps "* ]]; then
  rm -f "$out"/steps.jsonl
  for policy in $policies; do
    sed "s/^  policy: headroom/  policy: $policy/" benches/goodput-gateway.yaml >"$out/gateway-$policy.yaml"
    up "$out/gateway-$policy.yaml"
    window=0
    bench_pids=()
    for rate in ${schedule//,/ }; do
      window=$((window + 1))
      "$bin" bench --url http://127.0.0.1:8180 --model llama-3.1-8b --prompt-tokens 64 \
        --max-tokens 64 --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 --rate "$rate" \
        --duration 10 --seed "$window" --json 2>/dev/null |
        sed "s/^/{\"policy\":\"$policy\",\"window\":$window,\"r\":/; s/$/}/" >"$out/window-$window.jsonl" &
      bench_pids+=($!)
      sleep 10
    done
    wait "${bench_pids[@]}"
    cat "$out"/window-*.jsonl >>"$out/steps.jsonl"
    rm -f "$out"/window-*.jsonl
    echo "steps: $policy done" >&2
    stop
  done
fi

if [[ " $parts " == *" bursts "* ]]; then
  cat >"$out/burst-gateway.yaml" <<YAML
listen: {address: 127.0.0.1:8180}
admin: {listen: 127.0.0.1:9190}
backends:
  - {name: vllm-large, url: http://127.0.0.1:9101, dialect: openai, models: {llama-3.1-8b: llama-3.1-8b}}
curves: {half_life_s: 60}
YAML
  # exec: a client started in the background is then the process whose PID is kept, and dies
  # with the arm instead of loading the next arm's gateway.
  load() { exec "$bin" bench --url http://127.0.0.1:8180 --model llama-3.1-8b --prompt-tokens 512 \
    --max-tokens 128 --timeout 30 "$@" --json >/dev/null 2>&1; }
  for arm in bursts steady; do
    up "$out/burst-gateway.yaml"
    if [ "$arm" = bursts ]; then
      for ms in 5 7.5 10; do
        (load --rate 1600 --duration "$(python3 -c "print($ms / 1000)")" --seed 7)
        sleep 5
      done
    fi
    python3 benches/predictions.py http://127.0.0.1:9190 vllm-large "$steady" >"$out/predicted-$arm.jsonl" &
    poller=$!
    # Eight clients of one request at a time, started 250 ms apart: steady traffic that is no
    # burst itself (one closed loop at 8 would send its first eight requests at once).
    steady_pids=()
    for _ in $(seq 8); do
      load --concurrency 1 --requests 100000 &
      steady_pids+=($!)
      sleep 0.25
    done
    wait "$poller"
    kill "${steady_pids[@]}" 2>/dev/null || true
    wait "${steady_pids[@]}" 2>/dev/null || true
    echo "bursts: $arm done" >&2
    stop
  done
fi

python3 benches/rampup_table.py "$out" | tee "$out/table.md"
