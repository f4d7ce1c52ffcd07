#!/usr/bin/env bash
# Streaming TTFT added at about 16 concurrent streams by tpsgate builds, the bare hyper proxy and
# nginx, side by side, with more repetitions than `benches/overhead.sh` gives the same measure.
# `tpsgate sim` (2 ms decode step) on core 0 with the client; every proxy on core 1, all started
# once and kept up (as in a gateway's life), the arms interleaved REPS times.
#
# Open loop: Poisson arrivals at 240 requests/s for 4 s (32-token streams of ~66 ms: 16 in flight
# on average), the same arrival times for every arm of a repetition (`--seed` = repetition). A
# closed loop at c=16 sends each request the moment a stream ends, on one of the simulator's
# timer ticks, so its arrivals lock to the tick and a proxy's latency moves TTFT in steps of the
# tick (its medians jump between runs by ±100 µs); random arrivals see every phase of the tick,
# and the added latency shows as itself. "Added" is the arm's TTFT p50 (or p99) minus the direct
# arm's in the same repetition; prints each repetition and the median per arm. With PAIRED=1 the
# direct arm runs at the same time as each proxy's (two clients, independent arrivals), and "added"
# is against that run: what the machine does during a run then moves both alike.
#
# RATE=N sends N requests/s instead of 240 (about N/15 streams in flight). An arm
# NAME=BINARY+EXTRA.yaml appends EXTRA.yaml to its gateway config.
#
# Usage: benches/ttft-ab.sh NAME=BINARY... [bare] [nginx]   (REPS=10 by default; ports
# 9301-9319 free; installs nginx-light with apt when missing; about 5 s per arm and repetition)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 2; }
command -v nginx >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
cargo build --release --quiet --bin tpsgate --example bare_proxy
bin=$PWD/target/release/tpsgate
out=$PWD/target/ttft-ab
mkdir -p "$out"
rm -f "$out/runs.jsonl"
. benches/ab-lib.sh

taskset -c 0 "$bin" sim --listen 127.0.0.1:9301 --name sim --model m --step-base-ms 2 \
  --step-per-seq-ms 0 --max-batch 16384 --prefill-tokens-per-s 1000000000 >/dev/null 2>&1 &
pids+=($!)
arms=("direct:9301")
port=9310
for arm in "$@"; do
  port=$((port + 1))
  case $arm in
    bare) taskset -c 1 target/release/examples/bare_proxy "127.0.0.1:$port" 127.0.0.1:9301 & ;;
    nginx)
      nginx_conf nginx "$(nginx_proxy "$port" 127.0.0.1:9301)" >"$out/nginx.conf"
      taskset -c 1 nginx -c "$out/nginx.conf" & ;;
    *=*)
      {
        printf 'listen: {address: 127.0.0.1:%s}\nadmin: {listen: 127.0.0.1:%s}\nbackends:\n  - {name: sim, url: http://127.0.0.1:9301, dialect: openai, models: {m: m}, first_token_timeout_ms: 3600000}\n' \
          "$port" "$((port + 100))"
        arm_extra "$arm"
      } >"$out/gateway-$port.yaml"
      taskset -c 1 "$(arm_binary "$arm")" --threads 1 --log-format json serve --config "$out/gateway-$port.yaml" \
        >/dev/null 2>"$out/gateway-$port.log" & ;;
    *) echo "arm $arm: NAME=BINARY, bare or nginx" >&2; exit 2 ;;
  esac
  pids+=($!)
  arms+=("${arm%%=*}:$port")
done
for a in "${arms[@]}"; do
  for _ in $(seq 50); do
    curl -s -o /dev/null -m 1 -X POST "http://127.0.0.1:${a##*:}/v1/chat/completions" \
      -d '{"model":"m","messages":[],"max_tokens":2}' && break
    sleep 0.2
  done
done

load() { # port seed: one open-loop run, its JSON summary
  taskset -c 0 "$bin" bench --url "http://127.0.0.1:$1" --model m --prompt-tokens 16 \
    --rate "${RATE:-240}" --duration 4 --seed "$2" --max-tokens 32 --json 2>/dev/null | tail -1
}
for rep in $(seq "${REPS:-10}"); do
  for a in "${arms[@]}"; do
    if [ -n "${PAIRED:-}" ]; then
      # The direct arm runs beside each proxy's: whatever the machine does during those 4 s,
      # both see it. Its own arrivals (another seed): with the same ones, each pair of requests
      # would reach the simulator together and share its next step.
      [ "${a%%:*}" = direct ] && continue
      load 9301 "$((rep + 1000))" >"$out/beside.json" &
      result=$(load "${a##*:}" "$rep")
      wait $!
      echo "{\"rep\":$rep,\"arm\":\"${a%%:*}\",\"r\":$result,\"direct\":$(cat "$out/beside.json")}" >>"$out/runs.jsonl"
    else
      echo "{\"rep\":$rep,\"arm\":\"${a%%:*}\",\"r\":$(load "${a##*:}" "$rep")}" >>"$out/runs.jsonl"
    fi
  done
  echo "rep $rep done" >&2
done
python3 - "$out/runs.jsonl" <<'PY'
import json, statistics, sys
reps, beside = {}, {}
for line in open(sys.argv[1]):
    row = json.loads(line)
    reps.setdefault(row["rep"], {})[row["arm"]] = row["r"]
    if "direct" in row:  # PAIRED: the direct run beside this arm's
        beside.setdefault(row["rep"], {})[row["arm"]] = row["direct"]
arms = list(next(iter(reps.values())))
print("arm: TTFT p50 | added p50 median (per repetition) | added p99 median, µs")
for arm in arms:
    def base(rep, q):
        return (beside[rep][arm] if beside else reps[rep]["direct"])[q]
    added = lambda q: [(r[arm][q] - base(rep, q)) * 1e6 for rep, r in reps.items()]
    p50 = statistics.median(r[arm]["ttft_p50_s"] * 1e6 for r in reps.values())
    runs = " ".join(f"{x:+.0f}" for x in added("ttft_p50_s"))
    print(f"{arm}: {p50:.0f} | {statistics.median(added('ttft_p50_s')):+.0f} ({runs})"
          f" | {statistics.median(added('ttft_p99_s')):+.0f}")
PY
