#!/usr/bin/env bash
# Two builds on the zoo's fleets, alternated run by run (before, after, before, after, ...), so
# that both see the same machine minute by minute: a zoo cell's runs spread by a third, and only
# a difference beyond that spread means anything (docs/benchmarks/routing.md, "The zoo on three
# tuning fleets"). Runs benches/zoo.sh per seed, run and build, tags each result line with its
# build, and prints per seed and rate each build's runs and median. Tune on seeds below 1001.
#
# Usage: benches/zoo-ab.sh BEFORE_BIN AFTER_BIN [SEEDS="1 2 4"] [RUNS=3] [DURATION_S=15] [ARMS=headroom:queue]
# Writes target/zoo/ab.jsonl anew. About 15 s + 3 x DURATION_S per arm, build, run and seed.
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1 after=$2
seeds=${3:-1 2 4}
runs=${4:-3}
duration=${5:-15}
arms=${6:-headroom:queue}
out=target/zoo
mkdir -p "$out"
touch "$out/results.jsonl"
: >"$out/ab.jsonl"
for seed in $seeds; do
  for run in $(seq 1 "$runs"); do
    for build in before after; do
      bin=$before
      [ "$build" = before ] || bin=$after
      from=$(($(wc -l <"$out/results.jsonl") + 1))
      BIN=$bin ZOO_SEEDS=$seed-$seed RUN=$run benches/zoo.sh "$duration" $arms >/dev/null
      tail -n "+$from" "$out/results.jsonl" | sed "s/^{/{\"build\":\"$build\",/" >>"$out/ab.jsonl"
    done
  done
done
python3 - "$out/ab.jsonl" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)  # (seed, arm, rate, build) -> [goodput]
for line in open(sys.argv[1]):
    row = json.loads(line)
    runs[(row["seed"], row["arm"], row["r"]["rate_rps"], row["build"])].append(row["r"]["goodput_rps"])
print("| seed | arm | rate req/s | before | median | after | median | after ÷ before |")
print("|---|---|---|---|---|---|---|---|")
for seed, arm, rate in sorted({k[:3] for k in runs}):
    b, a = runs[(seed, arm, rate, "before")], runs[(seed, arm, rate, "after")]
    if not (a and b):
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    ratio = f"{ma / mb:.2f}" if mb > 0 else "—"
    show = lambda v: " / ".join(f"{x:.2f}" for x in v)
    print(f"| {seed} | {arm} | {rate} | {show(b)} | {mb:.2f} | {show(a)} | {ma:.2f} | {ratio} |")
PY
