#!/usr/bin/env bash
# Requests per second of two or more tpsgate builds (or the bare hyper proxy, or nginx) side by
# side: non-stream chat requests at c=32 from wrk against the static upstream of
# `benches/overhead.sh`, the proxy on core 1, upstream and wrk on core 0, the arms interleaved
# REPS times so that the machine's slow moments fall on every arm alike. Prints each run and the
# median per arm. For "did this change pay" between commits: build each into its own file first
# (e.g. `cp target/release/tpsgate /tmp/tpsgate.before`).
#
# An arm NAME=BINARY+EXTRA.yaml appends EXTRA.yaml to its gateway config (e.g. a `cluster:`
# section, to measure what it costs). With `api_keys` in it, set WRK_API_KEY=KEY: wrk sends it
# as a bearer token (benches/wrk-chat.lua).
#
# Usage: benches/rps-ab.sh NAME=BINARY... [bare] [nginx]   (REPS=5 by default; ports 9231-9234
# free; installs nginx-light and wrk with apt when missing; about 8 s per arm and repetition)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
for tool in nginx:nginx-light wrk:wrk; do
  command -v "${tool%%:*}" >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}" >/dev/null
done
out=$PWD/target/rps-ab
mkdir -p "$out"
rm -f "$out/runs.txt"
. benches/ab-lib.sh
nginx_conf static "server { listen 127.0.0.1:9231; location / { default_type application/json; return 200 '{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"s\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hello\"},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}'; } }" >"$out/static.conf"
nginx_conf proxy "$(nginx_proxy 9233 127.0.0.1:9231)" >"$out/proxy.conf"
cat >"$out/gateway.yaml" <<YAML
listen: {address: 127.0.0.1:9232}
admin: {listen: 127.0.0.1:9234}
backends:
  - {name: static, url: http://127.0.0.1:9231, dialect: openai, models: {s: s}}
YAML
taskset -c 0 nginx -c "$out/static.conf" & pids+=($!)

url() { echo "http://127.0.0.1:$1/v1/chat/completions"; }
run() { # name port command...
  local name=$1 port=$2 proxy
  shift 2
  taskset -c 1 "$@" >/dev/null 2>&1 & proxy=$!
  for _ in $(seq 50); do curl -s -o /dev/null -m 1 -X POST "$(url "$port")" && break; sleep 0.2; done
  taskset -c 0 wrk -t1 -c32 -d2s -s benches/wrk-chat.lua "$(url "$port")" >/dev/null
  local rps
  rps=$(taskset -c 0 wrk -t1 -c32 -d5s -s benches/wrk-chat.lua "$(url "$port")" | grep '^{' |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print(round(r["requests"] / r["duration_us"] * 1e6))')
  kill "$proxy"; wait "$proxy" 2>/dev/null || true
  echo "$name $rps" | tee -a "$out/runs.txt"
}

for _ in $(seq "${REPS:-5}"); do
  for arm in "$@"; do
    case $arm in
      nginx) run nginx 9233 nginx -c "$out/proxy.conf" ;;
      bare) cargo build --release --quiet --example bare_proxy
            run bare 9232 target/release/examples/bare_proxy 127.0.0.1:9232 127.0.0.1:9231 ;;
      *=*) { cat "$out/gateway.yaml"; arm_extra "$arm"; } >"$out/gateway-${arm%%=*}.yaml"
           run "${arm%%=*}" 9232 "$(arm_binary "$arm")" --threads 1 --log-format json serve \
             --config "$out/gateway-${arm%%=*}.yaml" ;;
      *) echo "arm $arm: NAME=BINARY, bare or nginx" >&2; exit 2 ;;
    esac
  done
done
echo "median requests/s:"
python3 - "$out/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, rps = line.split()
    runs.setdefault(name, []).append(int(rps))
for name, r in runs.items():
    print(f"{name} {statistics.median(r):.0f}  (runs: {' '.join(map(str, r))})")
PY
