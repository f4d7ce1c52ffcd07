#!/usr/bin/env bash
# The shared picture with real gateway processes only: R `tpsgate serve` replicas (20 backends,
# all in front of one simulator, `cluster:` at the default 50 ms) on one local redis-server,
# each sent its own open-loop Poisson stream of RATE requests a second (8-s streams: 500 tokens
# at a flat 62.5 tok/s). Over MEASURE_S seconds: Redis's CPU, commands and bytes a second, bytes
# per replica, and every replica's round trip (`last_round_ms`, polled). Then a hold: the
# traffic stops, every replica opens HOLD streams that outlast the check, and once nothing
# starts or ends, every replica's fleet-wide count of every backend must equal the sum of what
# the replicas hold there (`in_flight_here`); the time until it does is printed. What
# benches/scale.sh measures with emulated replicas, with real ones where they fit on one
# machine.
#
# Usage: [BIN=path] [RATE=0.5] [HOLD=2] benches/scale-real.sh [REPLICAS=8,16,32] [MEASURE_S=20] [RUNS=3]
# Needs ports 6397, 9131, 8201-82NN and 9201-92NN free; installs redis-server with apt when
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."
counts=${1:-8,16,32}
measure=${2:-20}
runs=${3:-3}
rate=${RATE:-0.5}
hold=${HOLD:-2}
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
command -v redis-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
out=$PWD/target/scale-real
mkdir -p "$out"
rm -f "$out/results.jsonl"
source benches/procs.sh

cat >"$out/sim.yaml" <<'EOF'
backends:
  - name: flat
    listen: 127.0.0.1:9131
    models: [sim-model]
    engine: {mode: batching, step_base_ms: 16, step_per_seq_ms: 0, max_batch: 100000}
EOF
most=$(tr , '\n' <<<"$counts" | sort -n | tail -1)
for i in $(seq "$most"); do
  {
    echo "listen: {address: 127.0.0.1:$((8200 + i))}"
    echo "admin: {listen: 127.0.0.1:$((9200 + i))}"
    echo "cluster: {redis_url: 'redis://127.0.0.1:6397/0', key_prefix: real, replica_id: r$i}"
    echo "backends:"
    for b in $(seq -w 0 19); do
      printf '  - {name: b%s, url: "http://127.0.0.1:9131", dialect: openai, models: {m: sim-model}}\n' "$b"
    done
  } >"$out/gateway-$i.yaml"
done

redis_info() { # the counters this script reads from INFO, as JSON
  redis-cli -p 6397 info | tr -d '\r' | python3 -c '
import json, sys
kv = dict(l.split(":", 1) for l in sys.stdin if ":" in l and not l.startswith("#"))
print(json.dumps({k: float(kv[k]) for k in ("used_cpu_sys", "used_cpu_user", "total_commands_processed", "total_net_input_bytes", "total_net_output_bytes")}))'
}

for run in $(seq "$runs"); do
for replicas in ${counts//,/ }; do
  redis-server --port 6397 --save '' --appendonly no >/dev/null 2>&1 & pids+=($!)
  for _ in $(seq 50); do redis-cli -p 6397 ping >/dev/null 2>&1 && break; sleep 0.1; done
  "$bin" sim --config "$out/sim.yaml" >/dev/null 2>&1 & pids+=($!)
  for i in $(seq "$replicas"); do
    "$bin" serve --config "$out/gateway-$i.yaml" >"$out/gateway-$i.log" 2>&1 & pids+=($!)
  done
  for i in $(seq "$replicas"); do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$((9200 + i))/admin/cluster" && break; sleep 0.2; done
  done
  # Every replica's round trip, polled in turn.
  python3 - "$replicas" "$out/rounds.jsonl" <<'PY' & poller=$!
import json, sys, time, urllib.request
n = int(sys.argv[1])
with open(sys.argv[2], "w") as f:
    while True:
        for i in range(1, n + 1):
            try:
                c = json.load(urllib.request.urlopen(f"http://127.0.0.1:{9200 + i}/admin/cluster", timeout=2))["cluster"]
            except Exception:
                sys.exit(0)
            f.write(json.dumps({"replica": i, "round_ms": c["last_round_ms"], "replicas": c["replicas"]}) + "\n")
        f.flush()
        time.sleep(0.2)
PY
  clients=()
  for i in $(seq "$replicas"); do
    "$bin" bench --url "http://127.0.0.1:$((8200 + i))" --model m --prompt-tokens 64 --max-tokens 500 \
      --rate "$rate" --duration $((measure + 10)) --seed "$((run * 1000 + i))" --timeout 60 --json \
      >/dev/null 2>&1 & clients+=($!)
  done
  sleep 8 # warm-up: streams reach their steady number
  before=$(redis_info)
  sleep "$measure"
  after=$(redis_info)
  kill "${clients[@]}" 2>/dev/null || true
  wait "${clients[@]}" 2>/dev/null || true
  kill "$poller" 2>/dev/null || true; wait "$poller" 2>/dev/null || true
  # The hold: streams that outlast the check, then every view against the sum.
  for i in $(seq "$replicas"); do
    for _ in $(seq "$hold"); do
      curl -sN -o /dev/null -m 30 "http://127.0.0.1:$((8200 + i))/v1/chat/completions" \
        -H 'content-type: application/json' \
        -d '{"model":"m","messages":[{"role":"user","content":"hold"}],"max_tokens":1500,"stream":true}' &
      pids+=($!)
    done
  done
  python3 - "$replicas" "$((replicas * hold))" <<'PY' >"$out/hold.json"
import json, sys, time, urllib.request
n, want = int(sys.argv[1]), int(sys.argv[2])
get = lambda i: json.load(urllib.request.urlopen(f"http://127.0.0.1:{9200 + i}/admin/backends", timeout=2))["backends"]
# Nothing starts or ends once every hold stream is in: from then on, the time until every
# replica's fleet-wide count of every backend equals the sum of the replicas' own.
t0 = time.time()
while time.time() - t0 < 10:
    views = [get(i) for i in range(1, n + 1)]
    if sum(b["in_flight_here"] for v in views for b in v) >= want:
        break
    time.sleep(0.02)
settled = time.time()
matched = None
while time.time() - settled < 5:
    views = [get(i) for i in range(1, n + 1)]
    held = {}
    for v in views:
        for b in v:
            held[b["name"]] = held.get(b["name"], 0) + b["in_flight_here"]
    if all(b["in_flight"] == held[b["name"]] for v in views for b in v):
        matched = (time.time() - settled) * 1000
        break
print(json.dumps({"held": sum(held.values()), "matched_after_ms": matched}))
PY
  python3 - "$before" "$after" "$measure" "$replicas" "$out/rounds.jsonl" "$out/hold.json" "$run" >>"$out/results.jsonl" <<'PY'
import json, statistics, sys
before, after = json.loads(sys.argv[1]), json.loads(sys.argv[2])
measure, replicas = float(sys.argv[3]), int(sys.argv[4])
d = {k: (after[k] - before[k]) / measure for k in before}
rounds = sorted(r["round_ms"] for r in map(json.loads, open(sys.argv[5])) if r["round_ms"] is not None)
seen = [r["replicas"] for r in map(json.loads, open(sys.argv[5]))]
hold = json.load(open(sys.argv[6]))
io = d["total_net_input_bytes"] + d["total_net_output_bytes"]
print(json.dumps({
    "run": int(sys.argv[7]),
    "replicas": replicas,
    "replicas_seen_max": max(seen) if seen else None,
    "redis_cpu": d["used_cpu_sys"] + d["used_cpu_user"],
    "commands_per_s": d["total_commands_processed"],
    "bytes_per_s": io,
    "bytes_per_s_per_replica": io / replicas,
    "round_ms_p50": statistics.median(rounds) if rounds else None,
    "round_ms_p99": rounds[int(0.99 * (len(rounds) - 1))] if rounds else None,
    **hold,
}))
PY
  stop
done
done
cat "$out/results.jsonl"
