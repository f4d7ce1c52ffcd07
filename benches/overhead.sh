#!/usr/bin/env bash
# What a proxy adds: the same `tpsgate sim` upstream reached directly, through nginx
# (proxy_buffering off) and through tpsgate, arms interleaved in one run and repeated, the proxy
# pinned to core 1 and the simulator and the client (`tpsgate bench`) to core 0. Writes the table
# into BENCHMARKS.md between the overhead markers (medians over repetitions; "added" is the arm
# minus direct in the same repetition).
#
# Usage: benches/overhead.sh [REPS=3]   (needs ports 9201-9203, 9293 free; installs nginx-light
# with apt when missing; about 10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
command -v nginx >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
cargo build --release --quiet
bin=$PWD/target/release/tpsgate
out=$PWD/target/overhead
mkdir -p "$out"
rm -f "$out/results.jsonl"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true   # idle streams need many descriptors
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The upstream: a 2 ms decode step, no prefill cost, room for every stream at once.
taskset -c 0 "$bin" sim --listen 127.0.0.1:9201 --name sim --model m --step-base-ms 2 \
  --step-per-seq-ms 0 --max-batch 16384 --prefill-tokens-per-s 1000000000 >/dev/null 2>&1 &
pids+=($!)
cat >"$out/nginx.conf" <<NGINX
worker_processes 1;
pid $out/nginx.pid;
error_log $out/nginx-error.log;
events { worker_connections 30000; }
http {
  access_log off;
  upstream sim { server 127.0.0.1:9201; keepalive 256; }
  server {
    listen 127.0.0.1:9202;
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 3600s;
    }
  }
}
NGINX
taskset -c 1 nginx -c "$out/nginx.conf" -g 'daemon off;' & pids+=($!)
cat >"$out/gateway.yaml" <<YAML
listen: {address: 127.0.0.1:9203}
admin: {listen: 127.0.0.1:9293}
limits: {drain_timeout_s: 1}
backends:
  - {name: sim, url: http://127.0.0.1:9201, dialect: openai, models: {m: m}}
YAML
taskset -c 1 "$bin" --threads 1 --log-format json serve --config "$out/gateway.yaml" >/dev/null 2>"$out/gateway.log" & pids+=($!)
gw=$!
sleep 1
nginx_pids() { local m; m=$(pgrep -f "nginx.*$out/nginx.conf" | head -1); echo "$m $(pgrep -P "$m" | tr '\n' ' ')"; }
cpu_ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }

bench() { # arm port kind args...
  local arm=$1 port=$2 kind=$3; shift 3
  local procs=""
  case $arm in nginx) procs=$(nginx_pids);; tpsgate) procs=$gw;; esac
  local before=0; [ -n "$procs" ] && before=$(cpu_ticks $procs)
  taskset -c 0 "$bin" bench --url "http://127.0.0.1:$port" --model m --prompt-tokens 16 --json "$@" 2>/dev/null \
    | while read -r line; do
        local after=0; [ -n "$procs" ] && after=$(cpu_ticks $procs)
        echo "{\"arm\":\"$arm\",\"kind\":\"$kind\",\"rep\":$rep,\"cpu_ticks\":$((after - before)),\"r\":$line}"
      done >>"$out/results.jsonl"
}
for rep in $(seq "$reps"); do
  for arm in direct:9201 nginx:9202 tpsgate:9203; do
    name=${arm%%:*}; port=${arm##*:}
    bench "$name" "$port" stream-c1 --concurrency 1 --requests 300 --max-tokens 32
    bench "$name" "$port" stream-c16 --concurrency 16 --requests 800 --max-tokens 32
    bench "$name" "$port" nonstream-c1 --no-stream --concurrency 1 --requests 2000 --max-tokens 1
    bench "$name" "$port" nonstream-c32 --no-stream --concurrency 32 --requests 6000 --max-tokens 1
    echo "rep $rep: $name done" >&2
  done
done
# Idle streams: a second simulator whose first token takes ten minutes (first_token_timeout_ms
# raised so that the gateway keeps waiting too).
taskset -c 0 "$bin" sim --listen 127.0.0.1:9211 --name slow --model m --step-base-ms 600000 \
  --step-per-seq-ms 0 --max-batch 16384 >/dev/null 2>&1 & pids+=($!)
sed -i 's/127.0.0.1:9201/127.0.0.1:9211/' "$out/nginx.conf" "$out/gateway.yaml"
sed -i 's/models: {m: m}}/models: {m: m}, first_token_timeout_ms: 3600000}/' "$out/gateway.yaml"
nginx -c "$out/nginx.conf" -s reload; sleep 1
kill "$gw"; wait "$gw" 2>/dev/null || true
taskset -c 1 "$bin" --threads 1 serve --config "$out/gateway.yaml" >/dev/null 2>&1 & pids+=($!)
gw=$!
sleep 1
for n in 1000 9000; do   # 9000: a proxy holds two descriptors per stream, and the hard limit here is 20000
  for arm in nginx:9202 tpsgate:9203; do
    name=${arm%%:*}; port=${arm##*:}
    case $name in nginx) procs=$(nginx_pids);; tpsgate) procs=$gw;; esac
    python3 benches/idle_streams.py "$port" "$n" $procs | sed "s/^/{\"arm\":\"$name\",\"kind\":\"idle\",\"r\":/; s/$/}/" >>"$out/results.jsonl"
    sleep 2
  done
done
python3 benches/overhead_table.py "$out/results.jsonl" "$(getconf CLK_TCK)" | tee "$out/table.md"
python3 benches/splice.py overhead "$out/table.md"
