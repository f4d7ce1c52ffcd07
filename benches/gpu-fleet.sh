#!/usr/bin/env bash
# The real-engine routing benchmark (benches/real-routing.sh) on a GPU, as the case that
# started issue 48 was seen: two `transformers serve` on one card, one batching and one serving a
# request at a time, the same randomly initialised 1B Llama (hidden 2048, 22 layers, bf16), 64-token
# prompts and replies, a comfortable and a marginal SLO. One short run, sized to one call of the
# workplace's `device` tool (under 8 minutes): one run, two rates, three arms.
#
# Run it where a GPU is lent, from this machine (the device's image has torch and transformers
# but not their serving extras, which travel as wheels; the gateway travels built and stripped):
#   echo /.whl/ >> .git/info/exclude; echo /gpu-bin/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl fastapi starlette uvicorn pydantic pydantic-core typing-inspection annotated-types \
#     openai anyio sniffio h11 httpx httpcore distro jiter rich
#   mkdir -p gpu-bin && cp target/release/tpsgate gpu-bin/ && strip gpu-bin/tpsgate
#   device run: carry [".whl", "gpu-bin"], command "benches/gpu-fleet.sh", timeout_s 540
# Results land in $OUT (the device's), tables on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
export OUT=${OUT:-$PWD/target/gpu-fleet}/routing
export BIN=${BIN:-$PWD/gpu-bin/tpsgate}
export PYTHON=${PYTHON:-python3}
export TRANSFORMERS=${TRANSFORMERS:-transformers}
export DEVICE=cuda HIDDEN=2048 LAYERS=22 DTYPE=bfloat16 LOAD_C=8 FRESH_ENGINES=0
exec benches/real-routing.sh 1 "${RATES:-2,5}" "${DURATION_S:-15}" headroom headroom:best_effort round_robin
