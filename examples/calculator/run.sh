#!/usr/bin/env bash
# The calculator example end to end on CPU: tiny model -> synthetic data -> SFT warm-up -> GRPO -> held-out table.
# Starts fresh each time: the example's own run directories are replaced.
#   bash examples/calculator/run.sh                     # the full recipe (seed 0, precision auto)
#   bash examples/calculator/run.sh --seed 1 --precision float32 --runs runs/seed1-float32
#   bash examples/calculator/run.sh --quick             # every stage, shrunk to a few steps (about a minute; CI runs
#                                                       # it on a base install to prove the path works; its numbers
#                                                       # mean nothing)
# Each stage ends with a line `run.sh: stage NAME S s` (its wall time); benchmarks/main_job_matrix.py reads them.
set -euo pipefail
cd "$(dirname "$0")/../.."
SYNTH=() SFT=() RL=()
SEED=0 PRECISION=auto RUNS=runs
usage() {
  echo "usage: bash examples/calculator/run.sh [--quick] [--seed N] [--precision auto|float32|bf16-mixed] [--runs DIR]" >&2
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
    --precision) [[ $# -ge 2 ]] || usage; PRECISION=$2; shift 2 ;;
    --runs) [[ $# -ge 2 ]] || usage; RUNS=$2; shift 2 ;;
    *) usage ;;
  esac
done
case "$PRECISION" in
  auto) ENGINE=auto ;;
  float32) ENGINE=float32 ;;
  bf16-mixed) ENGINE=bfloat16 ;;
  *) echo "run.sh: --precision must be auto, float32 or bf16-mixed, got '$PRECISION'" >&2; exit 2 ;;
esac
stage() {  # stage NAME COMMAND...: run it, then print its wall time
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  echo "run.sh: stage $name $(python -c "print(f'{$EPOCHREALTIME - $start:.1f}')") s"
}
rm -rf "$RUNS/calculator-sft" "$RUNS/calculator-rl"
stage init thermik model init --preset qwen2-1m --seed "$SEED" --out "$RUNS/calculator-init" --overwrite
stage synthesize thermik synthesize --env calculator --n 4000 --seed "$SEED" --out "$RUNS/calculator-data" \
  ${SYNTH[@]+"${SYNTH[@]}"}
stage sft thermik sft @ examples/calculator/sft.toml --seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/calculator-init" --train_path "$RUNS/calculator-data/sft.jsonl" \
  --model.train_precision "$PRECISION" ${SFT[@]+"${SFT[@]}"}
stage rl thermik rl @ examples/calculator/rl.toml --seed "$SEED" --data.seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/calculator-sft/model" --model.train_precision "$PRECISION" --inference.precision "$ENGINE" \
  ${RL[@]+"${RL[@]}"}
