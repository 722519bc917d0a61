#!/usr/bin/env bash
# Benchmark only: what `tools/bench/peer.py --tfjs` needs, kept apart from the project's own set-up.
#   build/onnx_venv/  a venv with optimum-onnx, onnx, onnxruntime and the CPU torch 2.13.0, for
#                     tools/bench/onnx_export.py (the ONNX export of a GGUF file)
#   build/tfjs/       transformers.js 4.3.1 and onnxruntime-web (tools/bench/tfjs/package*.json,
#                     `npm ci --ignore-scripts`: onnxruntime-node's install script would fetch
#                     CUDA binaries from outside the npm registry, and the browser needs none of it)
# Never a runtime dependency: tools/setup.sh, the product and CI do not use either.
#   bash tools/bench/setup_onnx.sh [--export]   (--export: also export SmolLM2-135M-Instruct to
#                                                 build/onnx/smollm2-135m-instruct, a few minutes)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=build/onnx_venv
PIP_PINS=(torch==2.13.0 optimum-onnx==0.1.0 optimum==2.1.0 transformers==4.57.6 onnx==1.23.2
          onnxruntime==1.32.0 safetensors numpy)

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import optimum.exporters.onnx, onnxruntime.quantization" 2>/dev/null; then
    echo "setup_onnx: $VENV (pip: ${PIP_PINS[*]})"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PIP_PINS[@]}" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
fi
echo "setup_onnx: $VENV ready"

mkdir -p build/tfjs
if ! cmp -s tools/bench/tfjs/package-lock.json build/tfjs/package-lock.json \
        || [ ! -f build/tfjs/node_modules/@huggingface/transformers/dist/transformers.js ]; then
    cp tools/bench/tfjs/package.json tools/bench/tfjs/package-lock.json build/tfjs/
    (cd build/tfjs && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
echo "setup_onnx: build/tfjs ready (transformers.js $(node -p "require('./build/tfjs/node_modules/@huggingface/transformers/package.json').version"))"

if [ "${1:-}" = "--export" ]; then
    GGUF=build/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$GGUF" ] || { echo "setup_onnx: no $GGUF (bash tools/setup.sh --models-only fetches it)"; exit 1; }
    "$VENV/bin/python" tools/bench/onnx_export.py "$GGUF" build/onnx/smollm2-135m-instruct
fi
