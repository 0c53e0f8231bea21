#!/usr/bin/env bash
# Build a separate virtual environment with tinker-cookbook, for the optional test that runs the cookbook's
# math_rl recipe against `thermik tinker` (tests/test_tinker_cookbook.py), as a user's laptop would.
#
# The cookbook cannot share thermik's environment: 0.5.8 (the newest that installs; 0.6.x needs tml-renderers
# >= 0.4.1, which the registry does not serve) pins transformers <= 5.5.4 and thermik needs >= 5.20.
#
# Usage: bash scripts/tinker_cookbook_venv.sh   (venv at $THERMIK_TINKER_COOKBOOK_VENV or ~/.cache/thermik/tinker-cookbook-venv)
set -euo pipefail

VENV="${THERMIK_TINKER_COOKBOOK_VENV:-$HOME/.cache/thermik/tinker-cookbook-venv}"
COOKBOOK_VERSION="${TINKER_COOKBOOK_VERSION:-0.5.8}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
# The cookbook imports torch; its CPU build is enough for a client (the index's default is a multi-GB CUDA build).
TORCH="${TORCH_SPEC:-torch==2.13.0+cpu}"
"$VENV/bin/python" -m pip install "$TORCH" "tinker-cookbook[math-rl]==$COOKBOOK_VERSION" "tinker==0.38.*"
"$VENV/bin/python" -c "import tinker, tinker_cookbook; print('tinker', tinker.__version__, 'cookbook in', '$VENV')"
