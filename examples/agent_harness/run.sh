#!/usr/bin/env bash
# An openai-agents tool agent (agent.py) trained with thermik on the calculator task, end to end on CPU:
# harness venv -> tiny model -> SFT warm-up (the calculator recipe's) -> held-out eval through the agent (before)
# -> GRPO through the agent -> held-out eval through the agent (after). docs/agents.md.
#   bash examples/agent_harness/run.sh                 # the recipe (seed 0)
#   bash examples/agent_harness/run.sh --seed 1 --runs runs/agent-seed1
#   bash examples/agent_harness/run.sh --quick         # every stage shrunk to a few steps (its numbers mean nothing)
# Each stage ends with a line `run.sh: stage NAME S s` (its wall time).
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=0 RUNS=runs SYNTH=() SFT=() RL=() EVAL=()
usage() { echo "usage: bash examples/agent_harness/run.sh [--quick] [--seed N] [--runs DIR]" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick)
      SYNTH=(--n 300) SFT=(--max_steps 6 --min_steps 0 --eval_every 3 --eval_size 4)
      RL=(--trainer.steps 2 --trainer.prompts_per_step 2 --trainer.group_size 4) EVAL=(--eval.size 8)
      shift ;;
    --seed) [[ $# -ge 2 ]] || usage; SEED=$2; shift 2 ;;
    --runs) [[ $# -ge 2 ]] || usage; RUNS=$2; shift 2 ;;
    *) usage ;;
  esac
done
H="${HARNESS_VENV:-$HOME/.cache/thermik/harness-venv}/bin/python"
[ -x "$H" ] || bash scripts/harness_venv.sh
stage() {  # stage NAME COMMAND...: run it, then print its wall time
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  echo "run.sh: stage $name $(python -c "print(f'{$EPOCHREALTIME - $start:.1f}')") s"
}
held_out() {  # held_out NAME MODEL: success on the held-out problems, played by agent.py
  thermik eval @ examples/agent_harness/rl.toml --name "$1" --output_dir "$RUNS" --model.path "$2" --seed "$SEED" \
    --agent.python "$H" ${EVAL[@]+"${EVAL[@]}"}
}
rm -rf "$RUNS/agent-sft" "$RUNS/agent-rl" "$RUNS/agent-before" "$RUNS/agent-after"
stage init thermik model init --preset qwen2-1m --seed "$SEED" --out "$RUNS/agent-init" --overwrite
stage synthesize thermik synthesize --env calculator --n 4000 --seed "$SEED" --out "$RUNS/agent-data" \
  ${SYNTH[@]+"${SYNTH[@]}"}
stage sft thermik sft @ examples/calculator/sft.toml --name agent-sft --seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/agent-init" --train_path "$RUNS/agent-data/sft.jsonl" ${SFT[@]+"${SFT[@]}"}
stage eval-before held_out agent-before "$RUNS/agent-sft/model"
# the held-out tables come from `thermik eval` on the same problems before and after; rl checks one at its end
stage rl thermik rl @ examples/agent_harness/rl.toml --seed "$SEED" --data.seed "$SEED" --output_dir "$RUNS" \
  --model.path "$RUNS/agent-sft/model" --agent.python "$H" --eval.size 1 ${RL[@]+"${RL[@]}"}
stage eval-after held_out agent-after "$RUNS/agent-rl/export"
python - "$RUNS" <<'PY'
import json, math, sys
scores = {name: json.load(open(f"{sys.argv[1]}/agent-{name}/eval.json")) for name in ("before", "after")}
for name, s in scores.items():
    se = math.sqrt(s["success"] * (1 - s["success"]) / max(s["problems"], 1))
    print(f"held-out success {name} GRPO: {s['success']:.3f} +- {se:.3f} (s.e., {s['problems']} problems, agent.py)")
b, a = scores["before"], scores["after"]
gain_se = math.sqrt(sum(s["success"] * (1 - s["success"]) / max(s["problems"], 1) for s in (a, b)))
print(f"gain: {a['success'] - b['success']:+.3f} +- {gain_se:.3f} (s.e.)")
PY
