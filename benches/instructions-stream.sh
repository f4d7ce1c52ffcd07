#!/usr/bin/env bash
# Instructions per streamed request, counted by callgrind: the streaming companion of
# benches/instructions.sh. tpsgate (`serve`, one thread, JSON request log on) and the bare hyper
# proxy each run under callgrind in front of `tpsgate sim` (2 ms decode step, no prefill cost);
# `tpsgate bench` sends 32-token streams at concurrency 16, 65 requests of warm-up, then the
# counters are zeroed and N requests (default 320) are counted. The sim and bench run natively.
# Per streamed request = instructions / N (32 content events and the role chunk each).
#
# Usage: N=320 benches/instructions-stream.sh [TPSGATE_BINARY]   (ports 9241-9244 free; installs
# valgrind with apt when missing; about 4 minutes). The binary given is the gateway measured; the
# simulator and the load come from this checkout's build. `ARMS=tpsgate` counts only the arms
# named.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
cargo build --release --quiet --bin tpsgate --example bare_proxy
bin=$PWD/target/release/tpsgate
gateway=${1:-$bin}
n=${N:-320}
out=$PWD/target/instructions-stream
mkdir -p "$out"
rm -f "$out"/callgrind.*
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"$bin" sim --listen 127.0.0.1:9241 --name sim --model m --step-base-ms 2 --step-per-seq-ms 0 \
  --max-batch 16384 --prefill-tokens-per-s 1000000000 >/dev/null 2>&1 & pids+=($!)
cat >"$out/gateway.yaml" <<YAML
listen: {address: 127.0.0.1:9242}
admin: {listen: 127.0.0.1:9244}
backends:
  - {name: sim, url: http://127.0.0.1:9241, dialect: openai, models: {m: m}}
YAML
streams() { # port requests
  "$bin" bench --url "http://127.0.0.1:$1" --model m --prompt-tokens 16 --concurrency 16 \
    --requests "$2" --max-tokens 32 --json 2>/dev/null | tail -1
}
count() { # arm port command...
  local arm=$1 port=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$arm" "$@" >/dev/null 2>"$out/$arm.log" &
  local vg=$!
  pids+=($vg)
  for _ in $(seq 100); do
    curl -s -o /dev/null -m 2 -X POST "http://127.0.0.1:$port/v1/chat/completions" \
      -d '{"model":"m","messages":[],"max_tokens":2}' && break
    sleep 0.3
  done
  streams "$port" 64 >/dev/null
  callgrind_control -z "$vg" >/dev/null
  local result
  result=$(streams "$port" "$n")
  callgrind_control -d "$vg" >/dev/null
  sleep 1
  kill "$vg" 2>/dev/null || true
  wait "$vg" 2>/dev/null || true
  local ir
  ir=$(callgrind_annotate "$out/callgrind.$arm.1" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}')
  echo "{\"arm\":\"$arm\",\"instructions\":$ir,\"requests\":$n,\"per_request\":$((ir / n)),\"bench\":$result}"
}
arms=${ARMS:-tpsgate bare}
[[ " $arms " == *" tpsgate "* ]] &&
  count tpsgate 9242 "$gateway" --threads 1 --log-format json serve --config "$out/gateway.yaml"
[[ " $arms " == *" bare "* ]] &&
  count bare 9243 target/release/examples/bare_proxy 127.0.0.1:9243 127.0.0.1:9241
true
