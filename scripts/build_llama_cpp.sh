#!/usr/bin/env bash
# Build llama-cpp-python from source for this CPU, for the llama.cpp row of benchmarks/engine_vs_hf.py.
#
# The registry's wheel of llama-cpp-python 0.3.36 segfaults at the first decode on the project's Zen 5 machine
# (AVX512-BF16, no AMX); a source build for the native CPU with AMX off runs (SmolLM2-135M Q4_1: ~130 tok/s at
# batch 1 on 2 threads). Building takes ~3 minutes on 2 cores (needs cmake and a C/C++ compiler).
#
# Usage: bash scripts/build_llama_cpp.sh          # builds the wheel into ~/.cache/thermik/wheels and installs it
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
wheels="${THERMIK_WHEELS:-$HOME/.cache/thermik/wheels}"
mkdir -p "$wheels"
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
"${PYTHON:-python}" -m pip wheel --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -w "$wheels"
"${PYTHON:-python}" -m pip install --no-deps "$wheels"/llama_cpp_python-"$version"-*.whl
"${PYTHON:-python}" -m pip install diskcache jinja2 numpy typing-extensions
"${PYTHON:-python}" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
