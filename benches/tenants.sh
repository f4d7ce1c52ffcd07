#!/usr/bin/env bash
# A noisy neighbour on the simulated fleet (config/sim-fleet.yaml behind
# benches/goodput-gateway.yaml, whose interactive class queues for room: TTFT <= 1 s and
# per-user TPS >= 25): two API keys, tenant B sending its share of the fleet's capacity
# (B_RATE, default 10 req/s: half of the 20 req/s where one gateway held 99.7% on this traffic,
# "Several replicas"), tenant A three times its share, open-loop, 64-token prompts and replies.
# Setups:
#   today  the build before fair lines (BASELINE=path: a class's line first come first served),
#          one gateway, no limits
#   fair   this build, one gateway, no limits: the line in weighted fair order by tokens
#   tpm    this build, four replicas sharing a local redis-server (cluster:), A held to its share
#          in tokens per minute (A_TPM, default B_RATE x 60 x 128 tokens = 76800), each
#          tenant's traffic split evenly over the replicas
# Each setup gets a fresh simulator and gateways, a warm-up (the same traffic for WARMUP_S,
# default 40 s; for tpm, then on until A's fleet-wide bucket, a minute's tokens and full at
# start, is below 2% of it in Redis, at most 5 minutes more), then DURATION_S measured. Per
# tenant: SLO attainment (a 429 counts as missed) and goodput; for tpm, the tokens A used
# fleet-wide per minute (summed over the replicas' /admin/keys) from 20 s into the measured
# window to its end, against its limit.
# Writes the table into its docs/benchmarks/ page between the tenants markers (median over runs).
#
# Usage: [BASELINE=path] [BIN=path] benches/tenants.sh [RUNS=1] [DURATION_S=60] [SETUPS...]
# Needs ports 8271-8274, 9271-9274, 9101-9104 and 6398 free; installs redis-server with apt when
# missing. About 2 minutes per setup per run (tpm: 3 to 7).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
duration=${2:-60}
shift $(( $# < 2 ? $# : 2 ))
setups=${*:-today fair tpm}
b_rate=${B_RATE:-10}
a_rate=$(python3 -c "print(3 * $b_rate)")
a_tpm=${A_TPM:-$(python3 -c "print(int($b_rate * 60 * 128))")}
warmup=${WARMUP_S:-40}
command -v redis-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
bin=${BIN:-$PWD/target/release/tpsgate}
[ -n "${BIN:-}" ] || cargo build --release --quiet
out=$PWD/target/tenants
mkdir -p "$out"
if [ $# -gt 0 ] && [ -f "$out/results.jsonl" ]; then
  for setup in $setups; do sed -i "/\"setup\": *\"$setup\"/d" "$out/results.jsonl"; done
else
  rm -f "$out/results.jsonl"
fi
export TENANT_A_KEY=key-of-tenant-a TENANT_B_KEY=key-of-tenant-b
source benches/procs.sh
trap 'stop; kill "${redis_pid:-}" 2>/dev/null || true' EXIT
redis-server --port 6398 --bind 127.0.0.1 --save '' --appendonly no >"$out/redis.log" 2>&1 &
redis_pid=$!

# Tokens tenant A used so far, summed over the replicas 1..n.
a_tokens() { # n
  local total=0 i
  for i in $(seq "$1"); do
    total=$((total + $(curl -s "http://127.0.0.1:$((9270 + i))/admin/keys" | python3 -c '
import json, sys
k = [k for k in json.load(sys.stdin)["keys"] if k["name"] == "tenant-a"][0]
print(k["input_tokens_total"] + k["output_tokens_total"])')))
  done
  echo "$total"
}

# Every tenant's bench on every replica at its part of the rate, together; `out` gets the lines.
traffic() { # replicas seconds seed json-file
  local n=$1 seconds=$2 seed=$3 file=$4 i tenant rate key bench_pids=()
  : >"$file"
  for i in $(seq "$n"); do
    for tenant in a b; do
      if [ $tenant = a ]; then rate=$a_rate; key=$TENANT_A_KEY; else rate=$b_rate; key=$TENANT_B_KEY; fi
      rate=$(python3 -c "print(round($rate / $n, 4))")
      "$bin" bench --url "http://127.0.0.1:$((8270 + i))" --model llama-3.1-8b --prompt-tokens 64 \
        --max-tokens 64 --slo-tps 25 --slo-ttft-ms 1000 --timeout 30 --rate "$rate" \
        --duration "$seconds" --seed "$((seed * 100 + i * 2 + ${#tenant}))" --api-key "$key" --json 2>/dev/null |
        sed "s/^/{\"tenant\":\"$tenant\",\"replica\":$i,\"r\":/; s/$/}/" >>"$file" &
      bench_pids+=($!)
    done
  done
  wait "${bench_pids[@]}"
}

for run in $(seq "$runs"); do
  for setup in $setups; do
    gw=$bin; n=1
    case $setup in
      today) gw=${BASELINE:?the today setup needs BASELINE=path to the build before fair lines} ;;
      tpm) n=4 ;;
    esac
    "$gw" sim --config config/sim-fleet.yaml >/dev/null 2>&1 & pids+=($!)
    for i in $(seq "$n"); do
      {
        sed "s/127.0.0.1:8180/127.0.0.1:$((8270 + i))/; s/127.0.0.1:9190/127.0.0.1:$((9270 + i))/" \
          benches/goodput-gateway.yaml
        limits=""
        [ "$setup" = tpm ] && limits=", limits: {tokens_per_minute: $a_tpm}"
        if [ "$setup" = today ]; then
          printf 'api_keys:\n  - {key_env: TENANT_A_KEY, class: interactive}\n  - {key_env: TENANT_B_KEY, class: interactive}\n'
        else
          printf 'api_keys:\n  - {key_env: TENANT_A_KEY, name: tenant-a, class: interactive%s}\n  - {key_env: TENANT_B_KEY, name: tenant-b, class: interactive}\n' "$limits"
        fi
        [ "$setup" = tpm ] && printf 'cluster:\n  redis_url: redis://127.0.0.1:6398/0\n  key_prefix: tenants-%s\n' "$run"
      } >"$out/gateway-$i.yaml"
      "$gw" serve --config "$out/gateway-$i.yaml" >"$out/gateway-$i.log" 2>&1 & pids+=($!)
    done
    sleep 2
    if [ "$setup" = tpm ]; then
      # Until A's fleet-wide bucket (a minute's tokens, full at start) is drained: shed
      # requests give their tokens back, so with the line full this takes minutes, not one.
      traffic "$n" 600 "$((1000 + run))" "$out/warmup.jsonl" &
      warm_pid=$!
      sleep "$warmup"
      for _ in $(seq 300); do
        level=$(redis-cli -p 6398 HGET "{tenants-$run}:key:tenant-a:tokens" level)
        python3 -c "import sys; sys.exit(0 if float('${level:-inf}') < 0.02 * $a_tpm else 1)" && break
        sleep 1
      done
      echo "run $run: A's bucket at ${level:-?} tokens after warm-up" >&2
      pkill -f "bench --url http://127.0.0.1:827" || true
      wait "$warm_pid" || true
    else
      traffic "$n" "$warmup" "$((1000 + run))" "$out/warmup.jsonl"
    fi
    # A's tokens per minute once its bucket (a minute's worth, full at start) is drained: from
    # 20 s into the measured window to its end.
    traffic "$n" "$duration" "$run" "$out/level.jsonl" &
    traffic_pid=$!
    used=0; span=1
    if [ "$setup" = tpm ]; then
      sleep 20
      t0=$(date +%s.%N); before=$(a_tokens "$n")
      sleep "$((duration - 20))"
      used=$(( $(a_tokens "$n") - before )); span=$(python3 -c "import time; print(time.time() - $t0)")
    fi
    wait "$traffic_pid"
    python3 - "$setup" "$run" "$span" "$used" "$a_tpm" "$out/level.jsonl" >>"$out/results.jsonl" <<'PY'
import json, sys
setup, run, span, used, tpm, path = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
out = {"setup": setup, "run": int(run)}
for tenant in "ab":
    mine = [r["r"] for r in rows if r["tenant"] == tenant]
    n = sum(r["requests"] for r in mine)
    good = sum(r["slo_attainment"] * r["requests"] for r in mine)
    out[tenant] = {"requests": n, "attainment": good / n if n else 0.0,
                   "goodput_rps": sum(r["goodput_rps"] for r in mine)}
if setup == "tpm":
    out["a_tokens_per_min"] = int(used) * 60 / float(span)
    out["a_tpm_limit"] = int(tpm)
print(json.dumps(out))
PY
    echo "run $run: $setup done" >&2
    stop
  done
done
python3 benches/tenants_table.py "$out/results.jsonl" "$b_rate" "$a_rate" >"$out/table.md"
cat "$out/table.md"
python3 benches/splice.py tenants "$out/table.md"
