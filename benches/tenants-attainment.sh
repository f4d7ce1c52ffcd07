#!/usr/bin/env bash
# The gateway's own per-key SLO attainment (/admin/keys, "How well each key's SLO was met" in
# docs/gateway.md) against the load client's, on the noisy neighbour of benches/tenants.sh (its
# "fair" setup: tenant B at 10 req/s, tenant A at 30, one gateway over config/sim-fleet.yaml):
# 30 s of warm-up, then the verdicts counted before and after 60 s of the same traffic.
# Usage: benches/tenants-attainment.sh (needs ports 8271, 9271 and 9101-9104 free; ~2 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
out=$PWD/target/tenants-attainment; mkdir -p $out
export TENANT_A_KEY=key-of-tenant-a TENANT_B_KEY=key-of-tenant-b
$bin sim --config config/sim-fleet.yaml >/dev/null 2>&1 & SIM=$!
{ sed "s/127.0.0.1:8180/127.0.0.1:8271/; s/127.0.0.1:9190/127.0.0.1:9271/" benches/goodput-gateway.yaml
  printf 'api_keys:\n  - {key_env: TENANT_A_KEY, name: tenant-a, class: interactive}\n  - {key_env: TENANT_B_KEY, name: tenant-b, class: interactive}\n'; } > $out/gw.yaml
$bin serve --config $out/gw.yaml > $out/gw.log 2>&1 & GW=$!
trap 'kill $SIM $GW 2>/dev/null || true' EXIT
sleep 2
traffic() { # seconds seed file
  : > $3
  local pids=()
  for t in a b; do
    if [ $t = a ]; then rate=30; key=$TENANT_A_KEY; else rate=10; key=$TENANT_B_KEY; fi
    $bin bench --url http://127.0.0.1:8271 --model llama-3.1-8b --prompt-tokens 64 --max-tokens 64 \
      --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 --rate $rate --duration $1 --seed $(($2 * 10 + ${#t})) \
      --api-key $key --json 2>/dev/null | sed "s/^/{\"tenant\":\"$t\",\"r\":/; s/$/}/" >> $3 &
    pids+=($!)
  done
  wait "${pids[@]}"
}
traffic 30 7 $out/warm.jsonl
curl -s http://127.0.0.1:9271/admin/keys > $out/before.json
traffic 60 1 $out/run.jsonl
sleep 2
curl -s http://127.0.0.1:9271/admin/keys > $out/after.json
python3 - $out <<'PY'
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(f"{d}/run.jsonl") if l.strip()]
def verdicts(path, name):
    k = [k for k in json.load(open(path))["keys"] if k["name"] == name][0]
    c = [c for c in k["slo"] if c["class"] == "interactive"]
    return c[0]["by_verdict"] if c else {}
for t, name in [("a", "tenant-a"), ("b", "tenant-b")]:
    mine = [r["r"] for r in rows if r["tenant"] == t]
    n = sum(r["requests"] for r in mine)
    good = sum(r["slo_attainment"] * r["requests"] for r in mine)
    before, after = verdicts(f"{d}/before.json", name), verdicts(f"{d}/after.json", name)
    diff = {v: after.get(v, 0) - before.get(v, 0) for v in after}
    judged = sum(n for v, n in diff.items() if v != "cancelled")
    print(f"{name}: client {n} requests, {good / n:.1%} met; gateway {sum(diff.values())} judged, "
          f"{diff.get('met', 0) / judged:.1%} met; by verdict {dict(sorted(diff.items()))}")
PY
