#!/usr/bin/env bash
# What the shared picture costs as the fleet grows: one real gateway (20 backends, all in front
# of one simulator, `cluster:` at the default 50 ms) among R emulated replicas (`tpsgate
# replicas`: the same protocol, the same statements and thinning, synthetic traffic at RATE
# new requests a second per replica, 8 s mean streams), on one local redis-server. For each R:
# Redis's CPU (seconds a second), commands and bytes a second, bytes per replica, the rounds the
# replicas achieved against their target (R / 50 ms), the real gateway's round-trip time, and
# whether its fleet-wide count of every backend equals the sum of the replicas' held requests
# within one interval once they hold still. Writes the table into its docs/benchmarks/ page between the
# scale markers (medians over runs).
#
# Usage: [BIN=path] benches/scale.sh [REPLICAS=10,100,500,1000] [MEASURE_S=20] [RUNS=3]
#   RATE=0.5 (new requests a second per replica)
# Needs ports 6397, 8131, 9181 and 9131 free; installs redis-server with apt when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
counts=${1:-10,100,500,1000}
measure=${2:-20}
runs=${3:-3}
rate=${RATE:-0.5}
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
command -v redis-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
out=$PWD/target/scale
mkdir -p "$out"
rm -f "$out/results.jsonl"
source benches/procs.sh

backends=$(python3 -c "print(','.join('b%02d' % i for i in range(20)))")
{
  echo "listen: {address: 127.0.0.1:8131}"
  echo "admin: {listen: 127.0.0.1:9181}"
  echo "cluster: {redis_url: 'redis://127.0.0.1:6397/0', key_prefix: scale, replica_id: real}"
  echo "backends:"
  for b in ${backends//,/ }; do
    printf '  - {name: %s, url: "http://127.0.0.1:9131", dialect: openai, models: {m: sim-model}}\n' "$b"
  done
} >"$out/gateway.yaml"

for run in $(seq "$runs"); do
for r in ${counts//,/ }; do
  redis-server --port 6397 --save '' --appendonly no >/dev/null 2>&1 & pids+=($!)
  for _ in $(seq 50); do redis-cli -p 6397 ping >/dev/null 2>&1 && break; sleep 0.1; done
  "$bin" sim --listen 127.0.0.1:9131 >/dev/null 2>&1 & pids+=($!)
  "$bin" serve --config "$out/gateway.yaml" >"$out/gateway-$r.log" 2>&1 & pids+=($!)
  for _ in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:9181/admin/cluster && break; sleep 0.2; done
  # The real gateway's view, every 50 ms, stamped with the wall clock.
  python3 - "$out/view-$r.jsonl" <<'PY' & poller=$!
import json, sys, time, urllib.request
with open(sys.argv[1], "w") as f:
    while True:
        try:
            b = json.load(urllib.request.urlopen("http://127.0.0.1:9181/admin/backends", timeout=2))
            c = json.load(urllib.request.urlopen("http://127.0.0.1:9181/admin/cluster", timeout=2))
        except Exception:
            break
        f.write(json.dumps({"t": time.time() * 1000,
                            "in_flight": {x["name"]: x["in_flight"] for x in b["backends"]},
                            "round_ms": c["cluster"]["last_round_ms"],
                            "replicas": c["cluster"]["replicas"]}) + "\n")
        f.flush()
        time.sleep(0.05)
PY
  "$bin" replicas --redis-url redis://127.0.0.1:6397/0 --key-prefix scale --replicas "$r" \
    --backends "$backends" --rate "$rate" --warmup-s 5 --measure-s "$measure" --hold-s 4 \
    >"$out/report-$r.json"
  kill "$poller" 2>/dev/null || true; wait "$poller" 2>/dev/null || true
  python3 - "$out/report-$r.json" "$out/view-$r.jsonl" "$run" >>"$out/results.jsonl" <<'PY'
import json, statistics, sys
report = json.load(open(sys.argv[1]))
views = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
held, start = report["held"], report["held_from_ms"]
# During the hold, the first moment the gateway's count of every backend equals the held sum.
during = [v for v in views if start <= v["t"] <= start + 3500]
matched = next((v["t"] - start for v in during if all(v["in_flight"].get(b) == n for b, n in held.items())), None)
measured = [v["round_ms"] for v in views if v["round_ms"] is not None and v["t"] < start]
report.update({
    "gateway_round_ms_p50": statistics.median(measured) if measured else None,
    "gateway_round_ms_p99": sorted(measured)[int(0.99 * (len(measured) - 1))] if measured else None,
    "gateway_matched_after_ms": matched,
    "held_total": sum(held.values()),
    "sums_match_held": report["sums_in_flight"] == {b: n for b, n in held.items()},
    "run": int(sys.argv[3]),
})
print(json.dumps(report))
PY
  stop
done
done
python3 benches/scale_table.py "$out/results.jsonl" >"$out/table.md"
python3 benches/splice.py scale "$out/table.md"
