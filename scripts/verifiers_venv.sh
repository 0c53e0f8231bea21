#!/usr/bin/env bash
# Build the virtual environment verifiers v1 environments run in (`--env.name verifiers:<taskset>`; the test
# tests/test_env_verifiers.py). docs/environments.md, "verifiers v1".
#
# verifiers cannot share thermik's environment: 0.4.0 pins mcp==2.0.0 and openai<3, thermik needs mcp>=2.3. It needs
# no torch. uv goes in too: verifiers' harnesses prepare their model program with `uv` (from PyPI, on first use).
#
# Usage: bash scripts/verifiers_venv.sh
#   venv at $VERIFIERS_VENV (default ~/.cache/thermik/verifiers-venv); thermik looks there too (the same variable,
#   else the default), or wherever --env.verifiers.python points
set -euo pipefail

venv="${VERIFIERS_VENV:-$HOME/.cache/thermik/verifiers-venv}"
packages=("verifiers==${VERIFIERS_VERSION:-0.4.0}" "uv>=0.9")

[ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")" && "${PYTHON:-python3}" -m venv "$venv"; }
"$venv/bin/python" -m pip install -q "${packages[@]}"
"$venv/bin/python" -c "import verifiers; print('verifiers', verifiers.__version__, 'in', '$venv')"
