#!/usr/bin/env bash
# The passive curve against a real engine nobody here wrote: `transformers serve` on CPU with a
# small randomly initialised Llama and a byte-level BPE tokenizer built here (benches/tiny_llama.py;
# no model hub is reachable, nothing is downloaded but the Python packages). For each engine mode
# (continuous batching, then one request at a time) a fresh gateway sits in front of it,
# `tpsgate bench` sweeps concurrency through the gateway, and the script prints the gateway's
# passive curve beside bench's active numbers with their relative errors, and a reference speed
# from whole (non-streamed) responses at concurrency 1: (latency of 64 tokens - latency of 1) / 63
# per token, which no stream framing or held-back text can bend.
#
# Usage: benches/real-engine.sh [CONCURRENCY=1,2,4,8] [REQUESTS=32]
#   VENV=dir (default target/engine-venv; created with torch and transformers[serving] from PyPI,
#   a few GiB, when missing)  MODES="batching serial"  MAX_TOKENS=64  PROMPT_TOKENS=64
# Needs ports 8300, 8390 and 9390 free. About 3 minutes per mode once the venv exists.
# A benchmark, not part of the test suite: it needs the Python packages.
set -euo pipefail
cd "$(dirname "$0")/.."
levels=${1:-1,2,4,8}
requests=${2:-32}
modes=${MODES:-batching serial}
max_tokens=${MAX_TOKENS:-64}
prompt_tokens=${PROMPT_TOKENS:-64}
venv=${VENV:-$PWD/target/engine-venv}
out=$PWD/target/real-engine
mkdir -p "$out"
if [ ! -x "$venv/bin/transformers" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch "transformers[serving]"
fi
cargo build --release --quiet
bin=$PWD/target/release/tpsgate
[ -f "$out/model/config.json" ] || "$venv/bin/python" benches/tiny_llama.py "$out/model"
source benches/procs.sh

cat >"$out/gateway.yaml" <<YAML
listen: {address: 127.0.0.1:8390}
admin: {listen: 127.0.0.1:9390}
backends:
  - {name: transformers, url: http://127.0.0.1:8300, dialect: openai, models: {tiny: "$out/model"}}
YAML
# The engine serves the model by its path; the gateway maps the name `tiny` onto it.
bench() { "$bin" bench --url "$1" --model "$2" --prompt-tokens "$prompt_tokens" --timeout 120 "${@:3}" --json 2>/dev/null; }

for mode in $modes; do
  flag=--no-continuous-batching
  [ "$mode" = batching ] && flag=--continuous-batching
  "$venv/bin/transformers" serve "$out/model" --device cpu --port 8300 "$flag" \
    >"$out/engine-$mode.log" 2>&1 & pids+=($!)
  for _ in $(seq 120); do curl -sf -o /dev/null http://127.0.0.1:8300/health && break; sleep 1; done
  "$bin" --log-format json serve --config "$out/gateway.yaml" >/dev/null 2>"$out/gateway-$mode.log" & pids+=($!)
  sleep 1
  # The reference first, straight to the engine: whole responses of 64 tokens and of 1.
  bench http://127.0.0.1:8300 "$out/model" --no-stream --concurrency 1 --requests 8 --max-tokens "$max_tokens" >"$out/reference-long-$mode.json"
  bench http://127.0.0.1:8300 "$out/model" --no-stream --concurrency 1 --requests 8 --max-tokens 1 >"$out/reference-short-$mode.json"
  bench http://127.0.0.1:8390 tiny --concurrency "$levels" --requests "$requests" --max-tokens "$max_tokens" >"$out/active-$mode.jsonl"
  curl -sf http://127.0.0.1:9390/admin/curves >"$out/passive-$mode.json"
  echo "$mode done" >&2
  stop
done

python3 - "$out" "$modes" "$max_tokens" <<'PY'
import json, sys
out, modes, max_tokens = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
err = lambda got, want: f"{100 * (got / want - 1):+.1f}%" if got and want else "-"
for mode in modes:
    long_ = json.load(open(f"{out}/reference-long-{mode}.json"))
    short = json.load(open(f"{out}/reference-short-{mode}.json"))
    if long_.get("first_error") or short.get("first_error"):
        print(f"{mode}: the reference failed: {long_.get('first_error') or short.get('first_error')}")
        continue
    tpot = (long_["latency_p50_s"] - short["latency_p50_s"]) / (max_tokens - 1)
    curve = json.load(open(f"{out}/passive-{mode}.json"))["curves"][0]
    points = {p["concurrency"]: p for p in curve["points"]}
    print(f"\n{mode}: reference speed at c=1 from whole responses {1 / tpot:.1f} tok/s; "
          f"{curve['observations']} requests seen by the gateway, estimated share {curve['estimated_share']}\n")
    print("| c | active tok/s p50 | passive tok/s p50 | error | active TTFT p50 ms | passive TTFT p50 ms | error | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for line in open(f"{out}/active-{mode}.jsonl"):
        a = json.loads(line)
        c = a["concurrency"]
        p = points.get(c, {})
        tps, ttft = p.get("per_user_tps_p50"), p.get("ttft_p50_s")
        a_tps, a_ttft = a.get("per_user_tps_p50"), a.get("ttft_p50_s")
        fmt = lambda v, k=1: f"{v * k:.1f}" if v else "-"
        print(f"| {c} | {fmt(a_tps)} | {fmt(tps)} | {err(tps, a_tps)} | {fmt(a_ttft, 1e3)} | {fmt(ttft, 1e3)} | {err(ttft, a_ttft)} | {a['errors']} |")
PY
