#!/usr/bin/env bash
# Build llama-cpp-python from source for this CPU, for the llama.cpp row of benchmarks/engine_vs_hf.py.
#
# The registry's wheel of llama-cpp-python 0.3.36 segfaults at the first decode on the project's Zen 5 machine
# (AVX512-BF16, no AMX); a source build for the native CPU with AMX off runs (SmolLM2-135M Q4_1: ~130 tok/s at
# batch 1 on 2 threads). Building takes ~3 minutes on 2 cores (needs cmake and a C/C++ compiler).
#
# Usage: bash scripts/build_llama_cpp.sh          # builds the wheel into ~/.cache/thermik/wheels and installs it
#
# THERMIK_LLAMA_ISA=avx2 builds for AVX2 + FMA + F16C only (no AVX512, no AVX-VNNI, no AMX: what an AVX2 laptop or
# VM runs) into ~/.cache/thermik/wheels-avx2 and installs it into THERMIK_LLAMA_TARGET (default
# ~/.cache/thermik/llama-avx2), not into the environment: put that directory first on PYTHONPATH to use it
# (benchmarks/engine_vs_hf.py --llama-cpp-path).
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
common="-DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF"
if [ "${THERMIK_LLAMA_ISA:-native}" = "avx2" ]; then
    wheels="${THERMIK_WHEELS:-$HOME/.cache/thermik/wheels-avx2}"
    export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF $common"
    install=(--target "${THERMIK_LLAMA_TARGET:-$HOME/.cache/thermik/llama-avx2}" --upgrade)
else
    wheels="${THERMIK_WHEELS:-$HOME/.cache/thermik/wheels}"
    export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX=OFF $common"
    install=()
fi
mkdir -p "$wheels"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
"${PYTHON:-python}" -m pip wheel --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -w "$wheels"
"${PYTHON:-python}" -m pip install --no-deps "${install[@]}" "$wheels"/llama_cpp_python-"$version"-*.whl
if [ "${#install[@]}" -eq 0 ]; then
    "${PYTHON:-python}" -m pip install diskcache jinja2 numpy typing-extensions
else  # numpy, jinja2 and typing-extensions come with thermik's environment: a second numpy there would shadow it
    "${PYTHON:-python}" -m pip install --no-deps "${install[@]}" diskcache
fi
if [ "${#install[@]}" -eq 0 ]; then
    "${PYTHON:-python}" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
fi
