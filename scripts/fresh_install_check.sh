#!/usr/bin/env bash
# A new user's first minutes: a clean clone of HEAD, a brand-new venv in a temp dir, pip's cache off,
# then the README's test command exactly as written. Prints pytest's summary and the wall time.
#   bash scripts/fresh_install_check.sh            # keep going: clean up the temp dir at the end
#   KEEP=1 bash scripts/fresh_install_check.sh     # leave the temp dir for a look
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d -t thermik-fresh-XXXXXX)"
[[ "${KEEP:-0}" == 1 ]] || trap 'rm -rf "$TMP"' EXIT
git clone --quiet "$ROOT" "$TMP/thermik"
python3 -m venv "$TMP/venv"
export PATH="$TMP/venv/bin:$PATH" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset VIRTUAL_ENV PYTHONPATH
cd "$TMP/thermik"
COMMAND="$(python scripts/readme_command.py test)"
echo "fresh venv: $(command -v python) ($(python -V)); running: $COMMAND"
START=$SECONDS
eval "$COMMAND"
echo "fresh install + tests: $((SECONDS - START)) s (clone of $(git rev-parse --short HEAD))"
