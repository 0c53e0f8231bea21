#!/usr/bin/env bash
# A Qwen3-style thinking model learns the calculator task with step-wise trajectories on CPU: tiny thinking model ->
# thinking conversations -> SFT warm-up -> GRPO (rollout.step_wise "on-break") -> held-out table.
# Starts fresh each time: the example's own run directories are replaced.
#   bash examples/thinking_calculator/run.sh                  # the full recipe (seed 0, float32)
#   bash examples/thinking_calculator/run.sh --seed 1 --runs runs/think-seed1
#   bash examples/thinking_calculator/run.sh --quick          # every stage, shrunk to a few steps (its numbers mean
#                                                             # nothing)
# Each stage ends with a line `run.sh: stage NAME S s` (its wall time).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=examples/thinking_calculator
SYNTH=() SFT=() RL=()
SEED=0 RUNS=runs
usage() {
  echo "usage: bash $HERE/run.sh [--quick] [--seed N] [--runs DIR]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick)
      SYNTH=(--n 300)
      SFT=(--max_steps 6 --min_steps 0 --eval_every 3 --eval_size 4)
      RL=(--trainer.steps 2 --trainer.prompts_per_step 2 --trainer.group_size 4 --eval.size 8 --checkpoint.every 1)
      shift ;;
    --seed) [[ $# -ge 2 ]] || usage; SEED=$2; shift 2 ;;
    --runs) [[ $# -ge 2 ]] || usage; RUNS=$2; shift 2 ;;
    *) usage ;;
  esac
done
stage() {  # stage NAME COMMAND...: run it, then print its wall time
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  echo "run.sh: stage $name $(python -c "print(f'{$EPOCHREALTIME - $start:.1f}')") s"
}
rm -rf "$RUNS/thinking-calculator-sft" "$RUNS/thinking-calculator-rl"
stage init thermik model init --preset qwen3-think-1m --seed "$SEED" --out "$RUNS/thinking-calculator-init" --overwrite
stage synthesize thermik synthesize --env calculator_thinking --n 4000 --seed "$SEED" \
  --out "$RUNS/thinking-calculator-data" ${SYNTH[@]+"${SYNTH[@]}"}
stage sft thermik sft @ "$HERE/sft.toml" --seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/thinking-calculator-init" --train_path "$RUNS/thinking-calculator-data/sft.jsonl" \
  ${SFT[@]+"${SFT[@]}"}
stage rl thermik rl @ "$HERE/rl.toml" --seed "$SEED" --data.seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/thinking-calculator-sft/model" ${RL[@]+"${RL[@]}"}
python "$HERE/report.py" "$RUNS/thinking-calculator-rl"
