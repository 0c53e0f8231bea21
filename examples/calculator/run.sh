#!/usr/bin/env bash
# The calculator example end to end on CPU: tiny model -> synthetic data -> SFT warm-up -> GRPO -> held-out table.
# Starts fresh each time: the example's own run directories are replaced.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf runs/calculator-sft runs/calculator-rl
thermik model init --preset qwen2-1m --out runs/calculator-init --overwrite
thermik synthesize --env calculator --n 4000 --out runs/calculator-data
thermik sft @ examples/calculator/sft.toml
thermik rl @ examples/calculator/rl.toml
