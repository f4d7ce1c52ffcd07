#!/usr/bin/env bash
# Real traffic shapes replayed (`tpsgate bench --trace`) against the conversations fleet (four
# equal pods with prefix caches, benches/conversations-fleet.yaml behind
# benches/conversations-gateway.yaml): the Mooncake trace (real prefix sharing, by block ids) and
# the Azure code-completion trace (real burstiness, no prefix information), both from
# ../shared/traces (TRACES=dir). A request is good when its TTFT <= 1 s and its per-user TPS >= 25.
# Arms: headroom (with the prefix index), prefix_hash (each prompt's first block pinned to one
# pod), round_robin. Each arm gets a fresh simulator and gateway; every arm replays the same
# requests at the same moments.
#   mooncake  as recorded in time (about 4 req/s), --token-scale 0.2 (prompts of about 3,000
#             tokens, 30-token replies): about 40% of the pods' prefill
#   azure     --time-scale 0.5 (twice as fast: about 5 req/s), lengths as recorded: about a
#             third of the pods' prefill, in the trace's own bursts
# (Four and five times as fast, the first scales tried, overloaded the pods' prefill 1.5 and
# 0.8 times over: every arm attained 2-8%.)
# Each replay stops at UNTIL_S seconds (default 60) and reports per WINDOW_S (default 20) and
# whole. Before it, WARMUP_S seconds (default 20; 0: none) of requests shaped like the trace's
# median (Mooncake at this scale 2,300-token prompts and 14-token replies, Azure 1,500 and 13)
# at 1 req/s, as a gateway in service has seen traffic before any minute of it: without one,
# the Azure replay's first burst (63 long prompts in 20 s) met a gateway that had seen nothing.
#
# TRACE_LIST (default "mooncake azure") names the traces to replay.
#
# Usage: [BIN=path] benches/traces.sh [RUNS=1] [ARMS...]
# Needs ports 8181, 9191 and 9111-9114 free.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
shift $(( $# < 1 ? $# : 1 ))
arms=${*:-headroom prefix_hash round_robin}
traces=${TRACES:-../shared/traces}
until_s=${UNTIL_S:-60}
warmup_s=${WARMUP_S:-20}
window=${WINDOW_S:-20}
bin=${BIN:-target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
out=target/traces
mkdir -p "$out"
rm -f "$out/results.jsonl"
source benches/procs.sh
for run in $(seq "$runs"); do
  for trace in ${TRACE_LIST:-mooncake azure}; do
    case $trace in
      mooncake) file=$traces/mooncake_synthetic.jsonl scale="--token-scale 0.2" shape="2300 14" ;;
      azure) file=$traces/azure_llm_2023_code.csv scale="--time-scale 0.5" shape="1500 13" ;;
    esac
    for arm in $arms; do
      "$bin" sim --config benches/conversations-fleet.yaml >/dev/null 2>&1 & pids+=($!)
      sed "s/    policy: headroom/    policy: $arm/" benches/conversations-gateway.yaml >"$out/gateway-$arm.yaml"
      "$bin" serve --config "$out/gateway-$arm.yaml" >"$out/gateway-$arm-$trace.log" 2>&1 & pids+=($!)
      sleep 1
      if [ "$warmup_s" != 0 ]; then
        read -r prompt reply <<<"$shape"
        "$bin" bench --url http://127.0.0.1:8181 --model llama-3.1-8b --prompt-tokens "$prompt" \
          --max-tokens "$reply" --rate 1 --duration "$warmup_s" --seed "$((1000 + run))" --timeout 30 \
          --json >/dev/null 2>&1
      fi
      # shellcheck disable=SC2086
      "$bin" bench --url http://127.0.0.1:8181 --model llama-3.1-8b --trace "$file" $scale \
        --trace-until "$until_s" --window "$window" --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 \
        --json 2>/dev/null \
        | sed "s/^/{\"arm\":\"$arm\",\"trace\":\"$trace\",\"run\":$run,\"r\":/; s/$/}/" >>"$out/results.jsonl"
      echo "run $run: $trace $arm done" >&2
      stop
    done
  done
done
python3 - "$out/results.jsonl" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
whole = collections.defaultdict(list)
for row in rows:
    if "window_s" not in row["r"]:
        whole[(row["trace"], row["arm"])].append(row["r"])
runs = len({row["run"] for row in rows})
med = lambda xs: statistics.median(xs) if xs else float("nan")
print(f"Median of {runs} run(s), whole replay (TTFT <= 1 s and >= 25 tok/s):\n")
print("| trace | arm | requests | attainment | goodput req/s | TTFT p50 / p90 ms | tok/s p10 / p50 | cached share |")
print("|---|---|---|---|---|---|---|---|")
for (trace, arm), rs in whole.items():
    g = lambda k: med([r.get(k) or 0 for r in rs])
    print(f"| {trace} | {arm} | {g('requests'):.0f} | {100 * g('slo_attainment'):.1f}% | {g('goodput_rps'):.2f} | "
          f"{1e3 * g('ttft_p50_s'):.0f} / {1e3 * g('ttft_p90_s'):.0f} | {g('per_user_tps_p10'):.1f} / {g('per_user_tps_p50'):.1f} | "
          f"{100 * g('cached_share'):.0f}% |")
PY
