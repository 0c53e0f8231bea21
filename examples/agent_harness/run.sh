#!/usr/bin/env bash
# An openai-agents tool agent (agent.py) trained with thermik on the calculator task, end to end on CPU:
# harness venv -> tiny model -> SFT warm-up on synthetic traces -> held-out eval (before) -> GRPO through the agent
# -> held-out eval (after). docs/agents.md.
#   bash examples/agent_harness/run.sh            # the recipe
#   bash examples/agent_harness/run.sh --quick    # every stage shrunk to a few steps (its numbers mean nothing)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=runs SEED=0 SFT_STEPS=600 RL_STEPS=40 EVAL=100 PROMPTS=8 GROUP=8
[[ "${1:-}" == --quick ]] && { SFT_STEPS=6 RL_STEPS=2 EVAL=4 PROMPTS=2 GROUP=2; }
H="${HARNESS_VENV:-$HOME/.cache/thermik/harness-venv}/bin/python"
[ -x "$H" ] || bash scripts/harness_venv.sh
AGENT=(--agent.entrypoint agent:run --agent.python "$H" --agent.cwd examples/agent_harness --agent.timeout_s 300)
COMMON=(--env.name calculator --env.max_turns 3 --rollout.max_input_length 1024 --rollout.max_generate_length 64
        --rollout.max_sequence_length 1280 --seed "$SEED")
thermik model init --preset qwen2-1m --seed "$SEED" --out "$RUNS/agent-init" --overwrite
thermik synthesize --env calculator --n 2000 --seed "$SEED" --out "$RUNS/agent-data"
thermik sft @ examples/calculator/sft.toml --name agent-sft --output_dir "$RUNS" --model.path "$RUNS/agent-init" \
  --train_path "$RUNS/agent-data/sft.jsonl" --max_steps "$SFT_STEPS" --eval_every 0
thermik eval --name agent-before --output_dir "$RUNS" --model.path "$RUNS/agent-sft/model" --eval.size "$EVAL" \
  "${COMMON[@]}" "${AGENT[@]}"
thermik rl --name agent-rl --output_dir "$RUNS" --model.path "$RUNS/agent-sft/model" "${COMMON[@]}" "${AGENT[@]}" \
  --trainer.steps "$RL_STEPS" --trainer.prompts_per_step "$PROMPTS" --trainer.group_size "$GROUP" \
  --eval.before false --eval.size "$EVAL" --checkpoint.every "$RL_STEPS"
thermik eval --name agent-after --output_dir "$RUNS" --model.path "$RUNS/agent-rl/export" --eval.size "$EVAL" \
  "${COMMON[@]}" "${AGENT[@]}"
python - "$RUNS" <<'PY'
import json, math, sys
for name in ("agent-before", "agent-after"):
    s = json.load(open(f"{sys.argv[1]}/{name}/eval.json"))
    se = math.sqrt(s["success"] * (1 - s["success"]) / max(s["problems"], 1))
    print(f"{name}: held-out success {s['success']:.3f} +- {se:.3f} (s.e., {s['problems']} problems)")
PY
