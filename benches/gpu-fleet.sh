#!/usr/bin/env bash
# The real-engine routing benchmark (benches/real-routing.sh) on a GPU, as the case that
# started issue 48 was seen: two `transformers serve` on one card, one batching and one serving a
# request at a time, the same randomly initialised 1B Llama (hidden 2048, 22 layers, bf16), 64-token
# prompts and replies, a comfortable and a marginal SLO. One short run, sized to one call of the
# workplace's `device` tool (under 9 minutes; BUDGET_S bounds the routing part): one run, two rates, four arms, the
# engines started once.
#
# Run it where a GPU is lent, from this machine (the device's image has torch and transformers
# but not their serving extras, which travel as wheels; the gateway travels built and stripped):
#   echo /.whl/ >> .git/info/exclude; echo /gpu-bin/ >> .git/info/exclude
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl fastapi uvicorn pydantic openai starlette
#   mkdir -p gpu-bin && cp target/release/tpsgate gpu-bin/ && strip gpu-bin/tpsgate
#   device run: carry [".whl", "gpu-bin"], command "benches/gpu-fleet.sh", timeout_s 600
# The work happens under /tmp (the model alone is 3 GB); what comes back is in $OUT (the
# device's): both SLOs' results and tables, the engines' measured speed, and the logs packed.
set -uo pipefail
cd "$(dirname "$0")/.."
back=${OUT:-$PWD/target/gpu-fleet}
mkdir -p "$back"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$back/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
  | tee -a "$back/gpu.txt"
work=/tmp/gpu-fleet
export OUT=$work
export BIN=${BIN:-$PWD/gpu-bin/tpsgate}
export PYTHON=${PYTHON:-python3}
export TRANSFORMERS=${TRANSFORMERS:-transformers}
export DEVICE=${DEVICE:-cuda} HIDDEN=${HIDDEN:-2048} LAYERS=${LAYERS:-22} DTYPE=${DTYPE:-bfloat16}
export LOAD_C=${LOAD_C:-8} FRESH_ENGINES=0
# A request still unanswered after 20 s has long missed a 1 s first token; waiting the default
# minute for each would spend the call draining queues instead of measuring; so would the
# CPU runs' 10 s of unscored warm-up per arm.
export REQUEST_TIMEOUT_S=${REQUEST_TIMEOUT_S:-15} WARMUP_S=${WARMUP_S:-6}
start=$(date +%s)
# RUNS=3 with one SLO and three arms (SLOS=comfortable ARMS="headroom p2c_peak_ewma round_robin")
# fits one call too: about 130 s to start and warm the engines, 35 s an arm and run.
timeout "${BUDGET_S:-490}" benches/real-routing.sh "${RUNS:-1}" "${RATES:-2,5}" "${DURATION_S:-12}" \
  ${ARMS:-headroom headroom:best_effort round_robin p2c_peak_ewma}
echo "real-routing.sh: exit $? after $(( $(date +%s) - start )) s" | tee -a "$back/gpu.txt"
cp "$work"/results-*.jsonl "$work"/table-*.md "$work"/engine-speed.json "$back"/ 2>/dev/null
tar -czf "$back/logs.tar.gz" -C "$work" --exclude 'model-*' . 2>/dev/null
ls -la "$back"
