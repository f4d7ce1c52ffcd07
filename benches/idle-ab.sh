#!/usr/bin/env bash
# Memory per idle stream of two or more tpsgate builds side by side: one simulator whose first
# token takes ten minutes, and for each build in turn a fresh gateway (one worker, on core 1)
# that N streams are opened through and held (`benches/idle_streams.py`, 500 at a time unless
# BATCH says otherwise); RSS after minus before, per stream. The builds alternate REPS times, so
# that the hour's conditions fall on each alike. For "did this change pay" between commits:
# build each into its own file first (e.g. `cp target/release/tpsgate /tmp/tpsgate.before`).
#
# Usage: benches/idle-ab.sh N NAME=BINARY...   (REPS=2 by default; ports 9311, 9303 and 9393
# free; N up to about half the open-file limit, which the script raises to the hard limit)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,10p "$0"; exit 2; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
n=$1
shift
out=$PWD/target/idle-ab
mkdir -p "$out"
cargo build --release --quiet --bin tpsgate
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
taskset -c 0 target/release/tpsgate sim --listen 127.0.0.1:9311 --name slow --model m \
  --step-base-ms 600000 --step-per-seq-ms 0 --max-batch 16384 >/dev/null 2>&1 & pids+=($!)
cat >"$out/gateway.yaml" <<YAML
listen: {address: 127.0.0.1:9303}
admin: {listen: 127.0.0.1:9393}
limits: {drain_timeout_s: 1}
backends:
  - {name: sim, url: http://127.0.0.1:9311, dialect: openai, models: {m: m}, first_token_timeout_ms: 3600000}
YAML
sleep 1
for _ in $(seq "${REPS:-2}"); do
  for arm in "$@"; do
    taskset -c 1 "${arm#*=}" --threads 1 --log-format json serve --config "$out/gateway.yaml" >/dev/null 2>&1 &
    gw=$!
    sleep 1
    echo "${arm%%=*} $(python3 benches/idle_streams.py 9303 "$n" "$gw")"
    kill "$gw"
    wait "$gw" 2>/dev/null || true
    sleep 1
  done
done
