#!/usr/bin/env bash
# Conversations and shared system prompts on four equal pods with prefix caches
# (benches/conversations-fleet.yaml behind benches/conversations-gateway.yaml): 16 system
# prompts of 2,000 tokens, each arrival a conversation of 4 turns (100-token questions,
# 64-token replies, 1 s to think), open-loop conversation arrivals at rising rates; a turn is
# good when its TTFT <= 1 s and its per-user TPS >= 25. Each pod's cache holds about a third
# of the working set. Arms:
#   blind   headroom with the prefix index off (routing as before it)
#   index   headroom with the prefix index
#   pinned  prefix_hash: each system prompt hashed onto one pod (perfect affinity, blind to load)
#   rr      round_robin (spreads every turn; close to random)
# Workloads: `uniform` (conversations spread evenly over the 16 prompts) and `hot` (one prompt
# carries half of them). Each arm gets a fresh simulator and gateway and a warm-up; run k
# offers every arm the same conversations (bench --seed k). Writes the table into its docs/benchmarks/ page
# between the conversations markers (median over runs), unless SPLICE=0 (an A/B of one arm,
# whose table would replace the recorded one).
#
# Usage: [BIN=path] [FIRST_RUN=1] benches/conversations.sh [RUNS=1] [RATES=2,4,6,8,12,16] [DURATION_S=20] [ARMS...]
# WORKLOADS (default "uniform hot") names the workloads to run.
# FIRST_RUN=k with arms given measures runs k..RUNS of those arms and keeps their earlier runs.
# Needs ports 8181, 9191 and 9111-9114 free. About a minute per rate per arm per workload.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
first=${FIRST_RUN:-1}
rates=${2:-2,4,6,8,12,16}
duration=${3:-20}
shift $(( $# < 3 ? $# : 3 ))
arms=${*:-blind index pinned rr}
# BIN=path: a binary built beforehand (so that editing the tree meanwhile changes nothing).
bin=${BIN:-target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
out=target/conversations
mkdir -p "$out"
# Given arms re-measure just those: their old rows go, the others stay.
if [ $# -gt 0 ] && [ -f "$out/results.jsonl" ]; then
  for arm in $arms; do
    for run in $(seq "$first" "$runs"); do
      sed -i "/\"arm\": *\"$arm\", *\"workload\": *\"[a-z]*\", *\"run\": *$run,/d" "$out/results.jsonl"
    done
  done
else
  rm -f "$out/results.jsonl"
fi
source benches/procs.sh
bench() { # shared-prefix extra, then bench args...
  local shared=$1; shift
  "$bin" bench --url http://127.0.0.1:8181 --model llama-3.1-8b --max-tokens 64 \
    --shared-prefix "groups=16,system=2000,question=100$shared" \
    --conversation turns=4,think_s=1 --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 "$@" 2>/dev/null
}
for run in $(seq "$first" "$runs"); do
  for workload in ${WORKLOADS:-uniform hot}; do
    shared=""; [ "$workload" = hot ] && shared=",hot=0.5"
    for arm in $arms; do
      case $arm in
        blind) policy=headroom; enabled=false ;;
        index) policy=headroom; enabled=true ;;
        pinned) policy=prefix_hash; enabled=true ;;
        rr) policy=round_robin; enabled=false ;;
        *) echo "unknown arm $arm" >&2; exit 2 ;;
      esac
      "$bin" sim --config benches/conversations-fleet.yaml >/dev/null 2>&1 & pids+=($!)
      sed -e "s/^    policy: headroom/    policy: $policy/" -e "s/^  enabled: true/  enabled: $enabled/" \
        benches/conversations-gateway.yaml >"$out/gateway-$arm.yaml"
      "$bin" serve --config "$out/gateway-$arm.yaml" >"$out/gateway-$arm.log" 2>&1 & pids+=($!)
      sleep 1
      bench "$shared" --rate 1 --duration 10 --seed "$((1000 + run))" --json >/dev/null   # warm-up
      bench "$shared" --rate "$rates" --duration "$duration" --seed "$run" --json \
        | sed "s/^/{\"arm\":\"$arm\",\"workload\":\"$workload\",\"run\":$run,\"r\":/; s/$/}/" >>"$out/results.jsonl"
      echo "run $run: $workload $arm done" >&2
      stop
    done
  done
done
python3 benches/conversations_table.py "$out/results.jsonl" >"$out/table.md"
cat "$out/table.md"
python3 benches/splice.py conversations "$out/table.md"
