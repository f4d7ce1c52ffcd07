#!/usr/bin/env bash
# Headroom against the baselines on fleets it was never tuned on: each seed draws a fleet, an
# SLO and three rates (benches/zoo.py: light, about the fleet's capacity at the SLO, twice it).
# Arms: headroom with `on_miss: queue` and with `best_effort`, round_robin, least_inflight,
# p2c_peak_ewma. Each arm gets a fresh simulator and gateway, a warm-up at the light rate, then
# the three rates open loop (Poisson, 256-token prompts, 128-token replies, all interactive),
# the same arrivals for every arm (bench --seed). A request is good when it meets the drawn SLO;
# a 429 counts as missed. benches/zoo_table.py prints headroom's goodput over the best
# baseline's per fleet and rate, and overall.
#
# Seeds 1-999 are for looking at while changing the router; seeds 1001 and up are held out, to
# be run only to report (ZOO_SEEDS=1001-1040), never while tuning.
#
# Usage: [BIN=path] [ZOO_SEEDS=1-8] [RUN=1] benches/zoo.sh [DURATION_S=20] [ARMS...]
# Writes target/zoo/results.jsonl (appended: one line per seed, arm, run and rate) and each
# fleet's files under target/zoo/SEED/. Needs ports 8191, 9291 and 9141-9146 free. About
# 15 s + 3 x DURATION_S per arm per fleet.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-20}
shift $(( $# < 1 ? $# : 1 ))
arms=${*:-headroom:queue headroom:best_effort round_robin least_inflight p2c_peak_ewma}
run=${RUN:-1}
range=${ZOO_SEEDS:-1-8}
bin=${BIN:-target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
out=target/zoo
mkdir -p "$out"
source benches/procs.sh
for seed in $(seq "${range%-*}" "${range#*-}"); do
  fleet=$(python3 benches/zoo.py "$seed" "$out/$seed")
  read -r tps ttft rates <<<"$(python3 -c 'import json,sys; f=json.loads(sys.argv[1]); print(f["slo_tps"], f["slo_ttft_ms"], ",".join(map(str, f["rates"])))' "$fleet")"
  warm=${rates%%,*}
  echo "seed $seed: $fleet" >&2
  for arm in $arms; do
    policy=${arm%%:*}
    on_miss=queue
    [ "$policy" = "$arm" ] || on_miss=${arm#*:}
    "$bin" sim --config "$out/$seed/fleet.yaml" >/dev/null 2>&1 & pids+=($!)
    sed -e "s/^  policy: headroom/  policy: $policy/" -e "s/on_miss: queue/on_miss: $on_miss/" \
      "$out/$seed/gateway.yaml" >"$out/$seed/gateway-$arm.yaml"
    "$bin" serve --config "$out/$seed/gateway-$arm.yaml" >"$out/$seed/gateway-$arm.log" 2>&1 & pids+=($!)
    sleep 1
    # A watchdog over each bench run (a client once sat idle with 20 streams open, its own
    # --timeout never firing): past it, the zoo goes on to the next arm and says what is missing.
    bench() { # WATCHDOG_S ARGS...
      local limit=$1
      shift
      timeout "$limit" "$bin" bench --url http://127.0.0.1:8191 --model zoo-model \
        --prompt-tokens 256 --max-tokens 128 --slo-tps "$tps" --slo-ttft-ms "$ttft" \
        --timeout 30 --json "$@" 2>/dev/null
    }
    # A watchdog's kill exits 124; any other failure is the client's own.
    said() { # STATUS WHAT
      [ "$1" = 124 ] && echo "  $arm: $2 stopped by its watchdog" >&2 \
        || echo "  $arm: $2 failed (exit $1)" >&2
    }
    bench 60 --rate "$warm" --duration 15 --seed "$((1000 + run))" >/dev/null \
      || said $? "warm-up (the measured rates run on colder curves)"
    if bench "$((3 * (duration + 40)))" --rate "$rates" --duration "$duration" --seed "$run" \
      | sed "s/^/{\"seed\":$seed,\"arm\":\"$arm\",\"run\":$run,\"r\":/; s/$/}/" >>"$out/results.jsonl"
    then
      echo "  $arm done" >&2
    else
      said $? "measured run (rates after the last written row are missing)"
    fi
    stop
  done
done
python3 benches/zoo_table.py "$out/results.jsonl"
