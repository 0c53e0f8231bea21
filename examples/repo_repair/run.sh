#!/usr/bin/env bash
# The repo_repair example on CPU: tiny model (4096-token context) -> generated tasks + expert trajectories -> SFT warm-up -> GRPO ->
# held-out table (held-out tasks come from template families training never used).
#   bash examples/repo_repair/run.sh [--seed N] [--runs DIR]
#   bash examples/repo_repair/run.sh --quick     # every stage shrunk to a few steps: proves the path, not a result
# Each stage's wall time goes to RUNS/repo-repair-times.jsonl ({"stage", "seconds"} per line).
set -euo pipefail
cd "$(dirname "$0")/../.."
SYNTH=(--n 160) SFT=() RL=()
SEED=0 RUNS=runs
usage() { echo "usage: bash examples/repo_repair/run.sh [--quick] [--seed N] [--runs DIR]" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick)
      SYNTH=(--n 4)
      SFT=(--max_steps 3 --min_steps 0 --eval_every 3 --eval_size 2 --batch_size 2)
      RL=(--trainer.steps 2 --trainer.prompts_per_step 2 --trainer.group_size 2 --eval.size 2
          --data.synthetic_eval_size 2 --env.max_turns 3 --checkpoint.every 1)
      shift ;;
    --seed) [[ $# -ge 2 ]] || usage; SEED=$2; shift 2 ;;
    --runs) [[ $# -ge 2 ]] || usage; RUNS=$2; shift 2 ;;
    *) usage ;;
  esac
done
rm -rf "$RUNS/repo-repair-sft" "$RUNS/repo-repair-rl"
mkdir -p "$RUNS"
TIMES="$RUNS/repo-repair-times.jsonl"
: > "$TIMES"
source examples/stage.sh  # stage NAME COMMAND...: runs it, appends its wall time to $TIMES
stage init thermik model init --preset qwen2-1m --context 4096 --seed "$SEED" --out "$RUNS/repo-repair-init" --overwrite
stage synthesize thermik synthesize --env repo_repair --seed "$SEED" --out "$RUNS/repo-repair-data" \
  --config examples/repo_repair/rl.toml "${SYNTH[@]}"
stage sft thermik sft @ examples/repo_repair/sft.toml --seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/repo-repair-init" --train_path "$RUNS/repo-repair-data/sft.jsonl" ${SFT[@]+"${SFT[@]}"}
stage rl thermik rl @ examples/repo_repair/rl.toml --seed "$SEED" --data.seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/repo-repair-sft/model" --data.train_path "$RUNS/repo-repair-data/rows.jsonl" \
  ${RL[@]+"${RL[@]}"}
