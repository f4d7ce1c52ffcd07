#!/usr/bin/env bash
# SLO attainment with several gateway replicas in front of one fleet (config/sim-fleet.yaml
# behind benches/goodput-gateway.yaml), with and without `cluster:` (a local redis-server), as
# sidecars see traffic: one open-loop Poisson arrival stream, split unevenly over the replicas
# (each replica gets its own Poisson stream at its share of the rate, which sums to one Poisson
# stream at the total rate). All interactive: 64-token prompts and replies; a request is good
# when its TTFT <= 1 s and its per-user TPS >= 25. Each setup gets a fresh simulator, fresh
# gateways and a fresh key prefix, a warm-up (4 req/s for 15 s), then the same rising ladder of
# rates, each level DURATION_S long, all replicas stepping together. Prints attainment over all
# requests and the worst replica's per level; writes the table into docs/benchmarks/replicas.md between the
# replicas markers (median over runs).
#
# A `-cold` setup (one-cold, eight-cold, eight-cold-cluster) is the same right after start: a
# warm-up of only 10 s at 2 req/s, then one level at COLD_RATE (default 16) req/s.
#
# FLEET=mock runs the same fleet's engines as mock servers written apart from the simulator
# (benches/mock_fleet.py, one asyncio process: issue 73's independent fleet rebuilt) and writes
# its table between the replicas-mock markers.
#
# FLEET=sharp runs the same against benches/sharp-fleet.yaml behind benches/sharp-gateway.yaml
# (knees that are sharp: small batches, a serial backend, a hosted one with a fixed TTFT near the
# SLO) and writes its table between the replicas-sharp markers.
#
# `one-as-eight` is one gateway taking the very arrivals of `eight` (the eight clients' streams,
# same shares and seeds, all sent to it): eight replicas against one gateway on the same
# traffic, stream by stream, without the luck of two different arrival draws.
#
# SYNC_MS sets `cluster.sync_interval_ms` (default 50, the default). FIRST_RUN (default 1) numbers
# the runs from there: run N uses the same seeds whatever the build, so more runs are new draws.
#
# Usage: [BIN=path] [FLEET=sim|sharp|mock] [SYNC_MS=50] [FIRST_RUN=1] benches/replicas.sh [RUNS=1] [RATES=8,12,16,20] [DURATION_S=30] [SETUPS...]
#   setups: one, four, four-cluster, eight, eight-cluster (default: these five), one-as-eight,
#   and the -cold ones
# Needs ports 8181-8188, 9191-9198, 9101-9104 and 6399 free; installs redis-server with apt
# when missing. About 3 minutes per setup per run.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
rates=${2:-8,12,16,20}
duration=${3:-30}
shift $(( $# < 3 ? $# : 3 ))
setups=${*:-one four four-cluster eight eight-cluster}
command -v redis-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
fleet=${FLEET:-sim}
case $fleet in
  sim) sim_config=config/sim-fleet.yaml gateway_config=benches/goodput-gateway.yaml marker=replicas ;;
  sharp) sim_config=benches/sharp-fleet.yaml gateway_config=benches/sharp-gateway.yaml marker=replicas-sharp ;;
  mock) gateway_config=benches/goodput-gateway.yaml marker=replicas-mock ;;
  *) echo "FLEET must be sim, sharp or mock" >&2; exit 2 ;;
esac
out=$PWD/target/$marker
mkdir -p "$out"
if [ $# -gt 0 ] && [ -f "$out/results.jsonl" ]; then
  for setup in $setups; do sed -i "/\"setup\":\"$setup\"/d" "$out/results.jsonl"; done
else
  rm -f "$out/results.jsonl"
fi
source benches/procs.sh
trap 'stop; kill "${redis_pid:-}" 2>/dev/null || true' EXIT

split() { # setup: the replicas' shares (the clients' streams), in percent
  case $1 in
    one-as-eight*) echo 30 20 15 10 10 5 5 5 ;;
    one*) echo 100 ;;
    four*) echo 40 30 20 10 ;;
    eight*) echo 30 20 15 10 10 5 5 5 ;;
  esac
}

gateways() { # setup: how many gateways the streams go to
  case $1 in
    one*) echo 1 ;;
    four*) echo 4 ;;
    eight*) echo 8 ;;
  esac
}

# One level: every replica's bench at its share of `rate`, started together, waited for.
level() { # setup run rate seconds seed shares...
  local setup=$1 run=$2 rate=$3 seconds=$4 seed=$5 i=0 bench_pids=()
  shift 5
  for share in "$@"; do
    i=$((i + 1))
    local r
    r=$(python3 -c "print(round($rate * $share / 100, 4))")
    "$bin" bench --url "http://127.0.0.1:$((8180 + (i - 1) % gws + 1))" --model llama-3.1-8b --prompt-tokens 64 \
      --max-tokens 64 --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 --rate "$r" \
      --duration "$seconds" --seed "$((seed * 100 + i))" --json 2>/dev/null |
      sed "s/^/{\"setup\":\"$setup\",\"run\":$run,\"total_rate\":$rate,\"replica\":$i,\"share\":$share,\"r\":/; s/$/}/" \
        >"$out/level-$i.jsonl" &
    bench_pids+=($!)
  done
  wait "${bench_pids[@]}"
  cat "$out"/level-*.jsonl
  rm -f "$out"/level-*.jsonl
}

redis-server --port 6399 --bind 127.0.0.1 --save '' --appendonly no >"$out/redis.log" 2>&1 &
redis_pid=$!
first=${FIRST_RUN:-1}
for run in $(seq "$first" "$((first + runs - 1))"); do
  for setup in $setups; do
    if [ "$fleet" = mock ]; then
      python3 benches/mock_fleet.py 9101 >/dev/null 2>&1 & pids+=($!)
    else
      "$bin" sim --config "$sim_config" >/dev/null 2>&1 & pids+=($!)
    fi
    read -r -a shares <<<"$(split "$setup")"
    gws=$(gateways "$setup")
    for i in $(seq "$gws"); do
      {
        sed "s/127.0.0.1:8180/127.0.0.1:$((8180 + i))/; s/127.0.0.1:9190/127.0.0.1:$((9190 + i))/" \
          "$gateway_config"
        case $setup in
          *-cluster) printf 'cluster:\n  redis_url: redis://127.0.0.1:6399/0\n  key_prefix: bench-%s-%s\n  sync_interval_ms: %s\n' "$setup" "$run" "${SYNC_MS:-50}" ;;
        esac
      } >"$out/gateway-$i.yaml"
      "$bin" --log-format json serve --config "$out/gateway-$i.yaml" >/dev/null 2>"$out/gateway-$i.log" &
      pids+=($!)
    done
    sleep 1
    case $setup in
      *-cold*) level "$setup" "$run" 2 10 "$((1000 + run))" "${shares[@]}" >/dev/null
               ladder=${COLD_RATE:-16} ;;
      *) level "$setup" "$run" 4 15 "$((1000 + run))" "${shares[@]}" >/dev/null   # warm-up: curves form
         ladder=$rates ;;
    esac
    for rate in ${ladder//,/ }; do
      level "$setup" "$run" "$rate" "$duration" "$run" "${shares[@]}" >>"$out/results.jsonl"
    done
    echo "run $run: $setup done" >&2
    stop
  done
done
kill "$redis_pid" 2>/dev/null || true
python3 benches/replicas_table.py "$out/results.jsonl" >"$out/table.md"
cat "$out/table.md"
python3 benches/splice.py "$marker" "$out/table.md"
