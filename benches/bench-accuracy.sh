#!/usr/bin/env bash
# How closely `tpsgate bench` measures what the simulator's /sim/truth says, for every backend of
# config/sim-fleet.yaml. Prints a Markdown table (the one in docs/benchmarks/simulator.md).
#
# Usage: benches/bench-accuracy.sh   (needs ports 9101-9104 free)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
bin=target/release/tpsgate
"$bin" sim --config config/sim-fleet.yaml >/dev/null 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
sleep 1

prompt=64
tokens=64
run() { # name port dialect levels requests
  "$bin" bench --url "http://127.0.0.1:$2" --model llama-3.1-8b --dialect "$3" \
    --concurrency "$4" --requests "$5" --max-tokens $tokens --prompt-tokens $prompt --json \
    | while read -r line; do echo "$1 $2 $3 $line"; done
}
{
  run vllm-large 9101 openai 1,8,32 64
  run vllm-large 9101 anthropic 1,8,32 64
  run sglang-small 9102 openai 1,4,8,16 48
  run llamacpp-serial 9103 openai 1,2,4 16
  run hosted-api 9104 openai 1,8,32 64
} | python3 benches/accuracy_table.py $prompt $tokens
