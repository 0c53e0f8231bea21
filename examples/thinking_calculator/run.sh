#!/usr/bin/env bash
# A Qwen3-style thinking model learns the calculator task with step-wise trajectories on CPU: tiny thinking model ->
# thinking conversations -> SFT warm-up -> GRPO (rollout.step_wise "on-break") -> held-out table (report.py, with
# each stage's wall time from RUNS/thinking-calculator-times.jsonl). Replaces the example's own run directories.
#   bash examples/thinking_calculator/run.sh                  # the full recipe (seed 0, float32)
#   bash examples/thinking_calculator/run.sh --seed 1 --runs runs/think-seed1
#   bash examples/thinking_calculator/run.sh --quick          # every stage shrunk to a few steps (numbers mean nothing)
set -euo pipefail
cd "$(dirname "$0")/../.."
EX=examples/thinking_calculator
SEED=0 RUNS=runs QUICK=0
usage() { echo "usage: bash $EX/run.sh [--quick] [--seed N] [--runs DIR]" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --seed) [[ $# -ge 2 ]] || usage; SEED=$2; shift 2 ;;
    --runs) [[ $# -ge 2 ]] || usage; RUNS=$2; shift 2 ;;
    *) usage ;;
  esac
done
SYNTH=() SFT=() RL=()
if [[ $QUICK == 1 ]]; then
  SYNTH=(--n 300)
  SFT=(--max_steps 6 --min_steps 0 --eval_every 3 --eval_size 4)
  RL=(--trainer.steps 2 --trainer.prompts_per_step 2 --trainer.group_size 4 --eval.size 8 --checkpoint.every 1)
fi
OUT=$RUNS/thinking-calculator
TIMES=$OUT-times.jsonl
rm -rf "$OUT-sft" "$OUT-rl"
mkdir -p "$RUNS" && : > "$TIMES"
source examples/stage.sh  # stage NAME COMMAND...: runs it, appends its wall time to $TIMES

stage init thermik model init --preset qwen3-think-1m --seed "$SEED" --out "$OUT-init" --overwrite
stage synthesize thermik synthesize --env calculator_thinking --n 4000 --seed "$SEED" --out "$OUT-data" \
  ${SYNTH[@]+"${SYNTH[@]}"}
stage sft thermik sft @ $EX/sft.toml --seed "$SEED" --output_dir "$RUNS" --model.path "$OUT-init" \
  --train_path "$OUT-data/sft.jsonl" ${SFT[@]+"${SFT[@]}"}
stage rl thermik rl @ $EX/rl.toml --seed "$SEED" --data.seed "$SEED" --output_dir "$RUNS" \
  --model.path "$OUT-sft/model" ${RL[@]+"${RL[@]}"}
python $EX/report.py "$OUT-rl" --times "$TIMES"
