#!/usr/bin/env bash
# The calculator example end to end on CPU: tiny model -> synthetic data -> SFT warm-up -> GRPO -> held-out table.
# Starts fresh each time: the example's own run directories are replaced.
#   bash examples/calculator/run.sh           # the full recipe
#   bash examples/calculator/run.sh --quick   # every stage, shrunk to a few steps (about a minute; CI runs it on a
#                                             # base install to prove the path works; its numbers mean nothing)
set -euo pipefail
cd "$(dirname "$0")/../.."
SYNTH=() SFT=() RL=()
if [[ "${1:-}" == --quick ]]; then
  SYNTH=(--n 300)
  SFT=(--max_steps 6 --min_steps 0 --eval_every 3 --eval_size 4)
  RL=(--trainer.steps 2 --trainer.prompts_per_step 2 --trainer.group_size 4 --eval.size 8 --checkpoint.every 1)
elif [[ $# -gt 0 ]]; then
  echo "usage: bash examples/calculator/run.sh [--quick]" >&2
  exit 2
fi
rm -rf runs/calculator-sft runs/calculator-rl
thermik model init --preset qwen2-1m --out runs/calculator-init --overwrite
thermik synthesize --env calculator --n 4000 --out runs/calculator-data ${SYNTH[@]+"${SYNTH[@]}"}
thermik sft @ examples/calculator/sft.toml ${SFT[@]+"${SFT[@]}"}
thermik rl @ examples/calculator/rl.toml ${RL[@]+"${RL[@]}"}
