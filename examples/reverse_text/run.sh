#!/usr/bin/env bash
# The reverse_text example end to end on CPU: tiny model -> synthetic data -> short SFT warm-up -> GRPO -> held-out table.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf runs/reverse-sft runs/reverse-rl  # start from nothing: no resumed checkpoint, no cached eval_before.json
thermik model init --preset qwen2-1m --out runs/reverse-init --overwrite
thermik synthesize --env reverse_text --n 4000 --out runs/reverse-data
thermik sft @ examples/reverse_text/sft.toml
thermik rl @ examples/reverse_text/rl.toml
