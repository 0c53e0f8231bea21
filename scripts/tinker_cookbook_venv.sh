#!/usr/bin/env bash
# Build a separate virtual environment with tinker-cookbook, for the optional test that runs the cookbook's
# math_rl recipe against `thermik tinker` (tests/test_tinker_cookbook.py), as a user's laptop would.
#
# The cookbook cannot share thermik's environment: 0.5.8 (the newest that installs; 0.6.x needs tml-renderers
# >= 0.4.1, which the registry does not serve) pins transformers <= 5.5.4 and thermik needs >= 5.20.
#
# Usage: bash scripts/tinker_cookbook_venv.sh
#   venv at $THERMIK_TINKER_COOKBOOK_VENV (default ~/.cache/thermik/tinker-cookbook-venv)
set -euo pipefail

venv="${THERMIK_TINKER_COOKBOOK_VENV:-$HOME/.cache/thermik/tinker-cookbook-venv}"
# The cookbook imports torch; its CPU build is enough for a client (the index's default is a multi-GB CUDA build).
packages=("${TORCH_SPEC:-torch==2.13.0+cpu}" "tinker-cookbook[math-rl]==${TINKER_COOKBOOK_VERSION:-0.5.8}" "tinker==0.38.*")

[ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")" && "${PYTHON:-python3}" -m venv "$venv"; }
"$venv/bin/python" -m pip install "${packages[@]}"
"$venv/bin/python" -c "import tinker, tinker_cookbook; print('tinker', tinker.__version__, 'cookbook in', '$venv')"
