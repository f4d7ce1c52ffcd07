#!/usr/bin/env bash
# Goodput of every routing policy on the simulated fleet (config/sim-fleet.yaml behind
# benches/goodput-gateway.yaml): open-loop Poisson arrivals at rising rates, 80% interactive
# (128 output tokens; a request is good when its TTFT <= 1 s and its per-user TPS >= 25) and
# 20% batch (512 output tokens). Each policy gets a fresh simulator and gateway, a
# warm-up so that curves exist, then the measured rates. Run k offers every policy the same
# arrivals (bench --seed k), so that policies differ only by where they send them. Writes the
# table into docs/benchmarks/routing.md between the goodput markers (median over runs).
#
# Usage: benches/goodput.sh [RUNS=3] [RATES=4,8,12] [DURATION_S=60] [ARMS...]
# An arm is a policy, or `policy:on_miss` (`headroom:best_effort`): the interactive class's
# `on_miss` is `queue` unless an arm names another.
# Environment: FLEET=noisy runs config/sim-fleet-noisy.yaml behind benches/noisy-gateway.yaml
# (two engines like the first real ones: speed spread from request to request, a prefill that
# stalls the batch); SLO_TPS and SLO_TTFT_MS set the interactive SLO (default 25 tok/s, 1000
# ms) in the gateway and the scoring alike. FLEET=shared runs config/sim-fleet-shared.yaml (a
# batching and a serial engine on one device) behind benches/shared-gateway.yaml, which names
# the device (SHARED=0: it does not); FLEET=bend runs config/sim-fleet-bend.yaml (the same two
# engines shaped like those on an H200: the batching one holds its speed past 8 in flight)
# behind the same gateway. WARMUP_RATE (default 5 req/s) is the warm-up's rate. Only
# the default fleet and SLO write docs/benchmarks/routing.md, and not with SPLICE=0.
# Needs ports 8180, 9190 and 9101-9104 (9121-9122 for FLEET=noisy, 9131-9132 for shared and bend) free. About 4 minutes per
# policy per run (a request not done in 30 s counts as failed).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rates=${2:-4,8,12}
duration=${3:-60}
shift $(( $# < 3 ? $# : 3 ))
policies=${*:-headroom round_robin least_inflight p2c_peak_ewma lowest_ttft oracle}
fleet=${FLEET:-default}
slo_tps=${SLO_TPS:-25}
slo_ttft=${SLO_TTFT_MS:-1000}
case "$fleet" in
  default) sim_config=config/sim-fleet.yaml gateway=benches/goodput-gateway.yaml model=llama-3.1-8b ;;
  noisy) sim_config=config/sim-fleet-noisy.yaml gateway=benches/noisy-gateway.yaml model=tiny-llama ;;
  shared) sim_config=config/sim-fleet-shared.yaml gateway=benches/shared-gateway.yaml model=tiny-llama ;;
  bend) sim_config=config/sim-fleet-bend.yaml gateway=benches/shared-gateway.yaml model=tiny-llama ;;
  *) echo "FLEET is default, noisy, shared or bend" >&2; exit 2 ;;
esac
# FLEET=shared SHARED=0: the gateway is not told that the two engines share a device.
untold=
[ "$fleet/${SHARED:-1}" != shared/0 ] || untold='/device: host/d'
warm_rate=${WARMUP_RATE:-5}
[ -n "${BIN:-}" ] || cargo build --release --quiet
bin=${BIN:-target/release/tpsgate}
out=target/goodput
[ "$fleet/$slo_tps/$slo_ttft" = default/25/1000 ] || out="target/goodput-$fleet-$slo_tps-$slo_ttft${untold:+-untold}"
mkdir -p "$out"
# Given policies re-measure just those: their old rows go, the others stay.
if [ $# -gt 0 ] && [ -f "$out/results.jsonl" ]; then
  for arm in $policies; do sed -i "/\"policy\":\"$arm\"/d" "$out/results.jsonl"; done
else
  rm -f "$out"/*.jsonl
fi
source benches/procs.sh
bench() { # extra args...
  "$bin" bench --url http://127.0.0.1:8180 --model "$model" --prompt-tokens 64 \
    --max-tokens 128 --mix interactive=0.8,batch=0.2:512 --slo-tps "$slo_tps" \
    --slo-ttft-ms "$slo_ttft" --timeout 30 "$@" 2>/dev/null
}
for run in $(seq "$runs"); do
  for arm in $policies; do
    policy=${arm%%:*}
    on_miss=queue
    [ "$policy" = "$arm" ] || on_miss=${arm#*:}
    "$bin" sim --config "$sim_config" >/dev/null 2>&1 & pids+=($!)
    sed -e "s/^  policy: headroom/  policy: $policy/" -e "s/on_miss: queue/on_miss: $on_miss/" \
      -e "s/min_tps: 25/min_tps: $slo_tps/" -e "s/max_ttft_ms: 1000/max_ttft_ms: $slo_ttft/" \
      -e "$untold" "$gateway" >"$out/gateway-$arm.yaml"
    "$bin" serve --config "$out/gateway-$arm.yaml" >"$out/gateway-$arm.log" 2>&1 & pids+=($!)
    sleep 1
    bench --rate "$warm_rate" --duration 20 --seed "$((1000 + run))" --json >/dev/null   # warm-up: curves form
    bench --rate "$rates" --duration "$duration" --seed "$run" --json \
      | sed "s/^/{\"policy\":\"$arm\",\"run\":$run,\"r\":/; s/$/}/" >>"$out/results.jsonl"
    # The curves the gateway learned by the end, for the pictures (benches/pictures.py).
    curl -sf http://127.0.0.1:9190/admin/curves >"$out/curves-$arm-$run.json" || true
    echo "run $run: $arm done" >&2
    stop
  done
done
SLO_TPS=$slo_tps SLO_TTFT_MS=$slo_ttft python3 benches/goodput_table.py "$out/results.jsonl" >"$out/table.md"
cat "$out/table.md"
if [ "$out" = target/goodput ]; then python3 benches/splice.py goodput "$out/table.md"; fi
