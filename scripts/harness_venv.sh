#!/usr/bin/env bash
# Build the virtual environment agent harnesses run in (`--agent.command`; tests/test_agent_harnesses.py and
# examples/agent_harness). docs/agents.md, "A harness venv".
#
# Harnesses are HTTP clients of thermik's capture endpoint, so they need no torch and no thermik. They cannot share
# thermik's environment: openai-agents needs websockets<17 and langchain-core 1.8 needs certifi>=2026.10.19, both
# older/newer than thermik's lock.
#
# Usage: bash scripts/harness_venv.sh
#   venv at $HARNESS_VENV (default ~/.cache/thermik/harness-venv); the tests look there too (the same variable, else
#   the default). Run a harness with `--agent.command "$HARNESS_VENV/bin/python my_agent.py"`.
set -euo pipefail

venv="${HARNESS_VENV:-$HOME/.cache/thermik/harness-venv}"
packages=(
  "openai>=3,<4"
  "openai-agents==${OPENAI_AGENTS_VERSION:-0.24.0}"
  "langgraph==${LANGGRAPH_VERSION:-1.2.22}"
  "langchain-openai==${LANGCHAIN_OPENAI_VERSION:-1.7.4}"
  "langchain>=1.5,<2"
)

[ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")" && "${PYTHON:-python3}" -m venv "$venv"; }
"$venv/bin/python" -m pip install -q "${packages[@]}"
"$venv/bin/python" - <<PY
import importlib.metadata as m
print("harness venv in $venv:", ", ".join(f"{p} {m.version(p)}" for p in
      ("openai", "openai-agents", "langgraph", "langchain-openai", "langchain")))
PY
