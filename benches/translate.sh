#!/usr/bin/env bash
# What translation adds to streaming TTFT, against pass-through in the same run. One `tpsgate
# sim` (2 ms decode step, both dialects on one port) on core 0 with the client; one gateway on
# core 1 in front of it as two backends: `oa` (dialect openai, model `ma`) and `an` (dialect
# anthropic, model `mb`). Four arms, interleaved REPS times, the same Poisson arrivals for every
# arm of a repetition (`--seed` = repetition):
#   pass_openai      OpenAI client, model ma -> oa, passed through
#   to_openai        Anthropic client, model ma -> oa, translated (Anthropic events from chunks)
#   pass_anthropic   Anthropic client, model mb -> an, passed through
#   to_anthropic     OpenAI client, model mb -> an, translated (chunks from Anthropic events)
# "Added" is a translated arm's TTFT p50 (p99) less its backend's pass-through arm's in the
# same repetition; prints each repetition and the median.
#
# Usage: benches/translate.sh   (REPS=10, RATE=240 req/s for 4 s, 32-token streams; ports
# 9331, 9332, 9432 free; about 20 s per repetition)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${BIN:-}" ] || cargo build --release --quiet --bin tpsgate
bin=${BIN:-$PWD/target/release/tpsgate}
out=$PWD/target/translate
mkdir -p "$out"
rm -f "$out/runs.jsonl"
. benches/ab-lib.sh

taskset -c 0 "$bin" sim --listen 127.0.0.1:9331 --name sim --model m --step-base-ms 2 \
  --step-per-seq-ms 0 --max-batch 16384 --prefill-tokens-per-s 1000000000 >/dev/null 2>&1 &
pids+=($!)
cat >"$out/gateway.yaml" <<'YAML'
listen: {address: 127.0.0.1:9332}
admin: {listen: 127.0.0.1:9432}
backends:
  - {name: oa, url: http://127.0.0.1:9331, dialect: openai, models: {ma: m}, first_token_timeout_ms: 3600000}
  - {name: an, url: http://127.0.0.1:9331, dialect: anthropic, models: {mb: m}, first_token_timeout_ms: 3600000}
YAML
taskset -c 1 "$bin" --threads 1 --log-format json serve --config "$out/gateway.yaml" \
  >/dev/null 2>"$out/gateway.log" &
pids+=($!)
for _ in $(seq 50); do
  curl -s -o /dev/null -m 1 -X POST http://127.0.0.1:9332/v1/chat/completions \
    -d '{"model":"ma","messages":[],"max_tokens":2}' && break
  sleep 0.2
done

load() { # dialect model seed: one open-loop run through the gateway, its JSON summary
  taskset -c 0 "$bin" bench --url http://127.0.0.1:9332 --dialect "$1" --model "$2" \
    --prompt-tokens 16 --rate "${RATE:-240}" --duration 4 --seed "$3" --max-tokens 32 \
    --json 2>/dev/null | tail -1
}
arms=("pass_openai:openai:ma" "to_openai:anthropic:ma" "pass_anthropic:anthropic:mb" "to_anthropic:openai:mb")
for rep in $(seq "${REPS:-10}"); do
  for a in "${arms[@]}"; do
    IFS=: read -r name dialect model <<<"$a"
    echo "{\"rep\":$rep,\"arm\":\"$name\",\"r\":$(load "$dialect" "$model" "$rep")}" >>"$out/runs.jsonl"
  done
  echo "rep $rep done" >&2
done
python3 - "$out/runs.jsonl" <<'PY'
import json, statistics, sys
reps = {}
for line in open(sys.argv[1]):
    row = json.loads(line)
    reps.setdefault(row["rep"], {})[row["arm"]] = row["r"]
print("arm: TTFT p50 µs | added p50, median (per repetition) | added p99, median; µs")
for arm, base in [("pass_openai", None), ("to_openai", "pass_openai"),
                  ("pass_anthropic", None), ("to_anthropic", "pass_anthropic")]:
    p50 = statistics.median(r[arm]["ttft_p50_s"] * 1e6 for r in reps.values())
    if base is None:
        print(f"{arm}: {p50:.0f}")
        continue
    added = lambda q: [(r[arm][q] - r[base][q]) * 1e6 for r in reps.values()]
    runs = " ".join(f"{x:+.0f}" for x in added("ttft_p50_s"))
    print(f"{arm}: {p50:.0f} | {statistics.median(added('ttft_p50_s')):+.0f} ({runs})"
          f" | {statistics.median(added('ttft_p99_s')):+.0f}")
PY
