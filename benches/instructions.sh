#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: a measure that neither other tenants of
# the machine (CPU steal) nor timer noise can move. nginx (one process), the bare hyper proxy
# (examples/bare_proxy.rs) and tpsgate (`serve`, one worker, JSON request log on) each run under
# callgrind in front of a static nginx upstream; after a warm-up the counters are zeroed, wrk sends
# small non-stream chat requests for a fixed time (4 connections), and the instructions counted are
# divided by the requests wrk completed. User space only: system calls are the kernel's work and
# are the same in kind for every arm. Writes the table into its docs/benchmarks/ page between the
# instructions markers.
#
# Usage: benches/instructions.sh [TPSGATE_BINARY]   (ports 9221-9225 free; installs valgrind,
# nginx-light and wrk with apt when missing; about 3 minutes). `ARMS=tpsgate benches/instructions.sh`
# counts only the arms named and prints their lines without touching docs/benchmarks/;
# `WRK_SCRIPT=file.lua` sends another request (with ARMS, for a one-off count);
# `VG_EXTRA=--cache-sim=yes` adds callgrind's cache simulation (instruction and data cache misses).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind:valgrind nginx:nginx-light wrk:wrk; do
  command -v "${tool%%:*}" >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}" >/dev/null
done
cargo build --release --quiet --bin tpsgate --example bare_proxy
bin=${1:-$PWD/target/release/tpsgate}
out=$PWD/target/instructions
mkdir -p "$out"
rm -f "$out"/callgrind.* "$out/results.jsonl"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

nginx_conf() { # name listen body
  cat <<NGINX
worker_processes 1;
master_process off;
daemon off;
pid $out/$1.pid;
error_log $out/$1-error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$2; location / { $3 } } }
NGINX
}
nginx_conf static 9221 "default_type application/json; return 200 '{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"s\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hello\"},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}';" >"$out/static.conf"
nginx -c "$out/static.conf" & pids+=($!)
nginx_conf proxy 9222 "proxy_pass http://u; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off;" \
  | sed 's|http {|http { upstream u { server 127.0.0.1:9221; keepalive 64; }|' >"$out/proxy.conf"
cat >"$out/gateway.yaml" <<YAML
listen: {address: 127.0.0.1:9224}
admin: {listen: 127.0.0.1:9225}
backends:
  - {name: static, url: http://127.0.0.1:9221, dialect: openai, models: {s: s}}
YAML
url() { echo "http://127.0.0.1:$1/v1/chat/completions"; }
load() { wrk -t1 -c4 -d"$2"s -s "${WRK_SCRIPT:-benches/wrk-chat.lua}" "$(url "$1")" | grep '^{'; }

count() { # arm port command...
  local arm=$1 port=$2; shift 2
  valgrind --tool=callgrind ${VG_EXTRA:-} --callgrind-out-file="$out/callgrind.$arm" "$@" >/dev/null 2>"$out/$arm.log" &
  local vg=$!
  pids+=($vg)
  for _ in $(seq 100); do curl -s -o /dev/null -m 2 -X POST "$(url "$port")" && break; sleep 0.3; done
  load "$port" 3 >/dev/null
  callgrind_control -z "$vg" >/dev/null
  local result
  result=$(load "$port" 10)
  callgrind_control -d "$vg" >/dev/null
  sleep 1
  kill "$vg" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$vg" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$vg" 2>/dev/null || true
  wait "$vg" 2>/dev/null || true
  local dump ir
  dump=$(ls -t "$out"/callgrind."$arm".* | head -1)
  ir=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}')
  echo "{\"arm\":\"$arm\",\"instructions\":$ir,\"wrk\":$result}" | tee -a "$out/results.jsonl"
}
arms=${ARMS:-nginx bare tpsgate}
for arm in $arms; do
  case $arm in
    nginx) count nginx 9222 nginx -c "$out/proxy.conf" ;;
    bare) count bare 9223 target/release/examples/bare_proxy 127.0.0.1:9223 127.0.0.1:9221 ;;
    tpsgate) count tpsgate 9224 "$bin" --threads 1 --log-format json serve --config "$out/gateway.yaml" ;;
    *) echo "unknown arm $arm (nginx, bare, tpsgate)" >&2; exit 2 ;;
  esac
done
[ "$arms" = "nginx bare tpsgate" ] && [ -z "${WRK_SCRIPT:-}" ] || exit 0
python3 - "$out/results.jsonl" >"$out/table.md" <<'PY'
import json, sys
rows = {r["arm"]: r for r in map(json.loads, open(sys.argv[1]))}
per = {a: r["instructions"] / r["wrk"]["requests"] for a, r in rows.items()}
print("| arm | requests counted | instructions per request | ÷ nginx | ÷ bare hyper |")
print("|---|---|---|---|---|")
for arm, label in (("nginx", "nginx"), ("bare", "bare hyper proxy"), ("tpsgate", "tpsgate")):
    r = rows[arm]
    errors = r["wrk"]["errors"] + r["wrk"]["non_2xx"]
    note = f" ({errors} errors)" if errors else ""
    print(f"| {label} | {r['wrk']['requests']}{note} | {per[arm]:,.0f} | "
          f"{per[arm] / per['nginx']:.2f}× | {per[arm] / per['bare']:.2f}× |")
PY
cat "$out/table.md"
python3 benches/splice.py instructions "$out/table.md"
