#!/usr/bin/env bash
# Builds tpsgate with profile-guided optimisation, the build the container image ships: an
# instrumented build of the gateway serves simulated traffic for about a minute, and the release
# build is then compiled with what that traffic ran (which branches are taken, which functions
# are hot) to lay out and inline its code. A proxied request's code does not fit the CPU's
# instruction cache (callgrind's cache simulation: 2,876 misses per request against bare hyper's
# 1,639), and packing the hot path together pays: about +21% requests/s (BENCHMARKS.md).
#
# Training traffic: the gateway (JSON request log, as in production) in front of `tpsgate sim`
# with both dialects, driven by `tpsgate bench`: non-stream and streaming requests, closed and
# open loops, on one worker thread and on one per core. Only the gateway's own run is profiled.
#
# Usage: deploy/pgo-build.sh   → target/pgo/tpsgate   (ports 9261-9264 free; about 7 minutes on
# 2 cores). Needs the llvm-profdata of rustc's LLVM: rustup's llvm-tools component (added when
# missing), or llvm-profdata-N from the distribution (e.g. Debian's llvm-22 for LLVM 22).
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
if [ ! -x "$profdata" ]; then
  if command -v "llvm-profdata-$llvm" >/dev/null; then
    profdata=llvm-profdata-$llvm
  elif command -v rustup >/dev/null; then
    rustup component add llvm-tools
  else
    echo "pgo-build.sh: no llvm-profdata for LLVM $llvm: install rustup's llvm-tools component" \
      "or your distribution's llvm-profdata-$llvm (Debian: apt-get install llvm-$llvm)" >&2
    exit 1
  fi
fi

work=$PWD/target/pgo
rm -rf "$work/profiles" "$work/discard"
mkdir -p "$work/profiles" "$work/discard"
# --target: without it RUSTFLAGS reach build scripts and proc macros too, which would profile
# the build itself.
build() { # target-dir rustflags
  RUSTFLAGS=$2 cargo build --release --locked --quiet --bin tpsgate --target "$host" \
    --target-dir "$work/$1"
}
build generate "-Cprofile-generate=$work/profiles"
bin=$work/generate/$host/release/tpsgate

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
listening() { # port: waits until something accepts on it
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
  echo "nothing listens on port $1" >&2
  exit 1
}
# The simulator and the client are not what is being optimised: their profiles are discarded.
export LLVM_PROFILE_FILE=$work/discard/%p.profraw
"$bin" sim --listen 127.0.0.1:9261 --name sim --model m --step-base-ms 2 --step-per-seq-ms 0 \
  --max-batch 16384 --prefill-tokens-per-s 1000000000 >/dev/null 2>&1 &
pids+=($!)
cat >"$work/gateway.yaml" <<YAML
listen: {address: 127.0.0.1:9263}
admin: {listen: 127.0.0.1:9264}
limits: {drain_timeout_s: 1}
backends:
  - {name: chat, url: http://127.0.0.1:9261, dialect: openai, models: {m: m}}
  - {name: messages, url: http://127.0.0.1:9261, dialect: anthropic, models: {m: m}}
YAML
listening 9261

traffic() {
  local gw=http://127.0.0.1:9263
  "$bin" bench --url $gw --model m --no-stream --max-tokens 1 --concurrency 32 --requests 20000
  "$bin" bench --url $gw --model m --no-stream --max-tokens 1 --concurrency 1 --requests 2000
  "$bin" bench --url $gw --model m --max-tokens 32 --rate 240 --duration 4
  "$bin" bench --url $gw --model m --max-tokens 32 --concurrency 1,16 --requests 300
  "$bin" bench --url $gw --model m --dialect anthropic --max-tokens 32 --concurrency 16 --requests 300
}
for threads in 1 0; do
  # 0: the default, a worker per core.
  flags=(--log-format json); [ "$threads" = 1 ] && flags=(--threads 1 "${flags[@]}")
  LLVM_PROFILE_FILE=$work/profiles/gateway-%p.profraw "$bin" "${flags[@]}" serve \
    --config "$work/gateway.yaml" >/dev/null 2>&1 &
  gateway=$!
  listening 9263
  traffic >/dev/null
  # Its profile is written as it exits.
  kill -TERM "$gateway"
  wait "$gateway" || true
done

"$profdata" merge -o "$work/tpsgate.profdata" "$work/profiles"
# From clean: cargo does not see a new profile under the same name, and would keep what an
# earlier profile built.
rm -rf "$work/use"
build use "-Cprofile-use=$work/tpsgate.profdata"
cp "$work/use/$host/release/tpsgate" "$work/tpsgate"
echo "built $work/tpsgate"
