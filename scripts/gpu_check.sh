#!/usr/bin/env bash
# thermik's CUDA check in one command (docs/gpu.md): the gpu-marked tests and a core subset, the calculator main job
# (SFT warm-up + GRPO on the tiny preset) in float32 and in bf16 with its held-out table, trainer throughput and MFU
# and generation throughput (engine vs transformers `generate`, batch 64) at SmolLM2-135M's and Qwen2.5-0.5B's
# shapes with random weights, and a 5-step RL run with weight sync and the rollout/trainer mismatch metrics.
# Every stage is time-boxed; a failed stage is recorded and the next one runs. Results in the output directory:
# summary.md (stage table and figures), results.json, logs.tar.gz (every log, metrics.jsonl and SFT result).
#
#     bash scripts/gpu_check.sh --device cuda --wheels .whl --out "$OUT"    # on a GPU machine, at most ~7.5 minutes
#     bash scripts/gpu_check.sh --device cpu --quick --out /tmp/gpu-check   # the dry run, tiny sizes (tests)
#
# Options: --device cuda|cpu|cuda:N (default cuda), --out DIR (default $OUT, else .gpu-check), --wheels DIR (wheels
# installed with pip --no-index --no-deps into a private directory first: scripts/gpu_wheels.sh makes them),
# --quick (tiny sizes), --stages env,tests,calculator,generate,mfu,rl_sync,packing,chunked_head (the default; a
# subset, or main_job: the SmolLM2 example, with --smollm2 DIR and --budget 600), --budget SECONDS (default 440:
# each stage's limit is cut to what is left of it), --keep (keep the work directory with its models and runs; by
# default only what logs.tar.gz holds is kept). No network, no pip index, no install into the environment.
set -uo pipefail

thermik() { "$PY" -m thermik.cli "$@"; }
quick() { ((QUICK)) && printf '%s\n' "$@"; }  # words only the quick (dry) run adds

# Precision pairs of the calculator runs: name -> trainer precision, engine precision.
declare -A TRAIN_PRECISION=([float32]=float32 [bf16]=bf16-mixed)
declare -A ENGINE_PRECISION=([float32]=float32 [bf16]=bfloat16)

stage_env() {
  "$PY" - <<'PY'
import os, platform, sys
import torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")
device = torch.device(os.environ["DEVICE"])
if device.type == "cuda":
    props = torch.cuda.get_device_properties(device)
    print(f"gpu {props.name}, {props.total_memory / 2**30:.1f} GiB, capability {props.major}.{props.minor}, "
          f"{props.multi_processor_count} SMs, bf16 {torch.cuda.is_bf16_supported()}, cuda {torch.version.cuda}")
import thermik.cli, thermik.runs.local, thermik.runs.sft, thermik.tasks.calculator.server  # the core path imports
from importlib.metadata import version
print(", ".join(f"{name} {version(name)}" for name in ("mcp", "pydantic", "pydantic-settings", "jsonschema")))
PY
  local rc=$?
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  thermik model init --preset qwen2-1m --out "$RUNS/calc-init" --overwrite >/dev/null || rc=1
  thermik synthesize --env calculator --n "$( ((QUICK)) && echo 200 || echo 4000)" --out "$RUNS/calc-data" || rc=1
  return $rc
}

stage_tests() {
  local rc=0
  # The tests that need CUDA (skipped on a machine without it), then the core subset on this machine's versions.
  "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py || rc=1
  ((QUICK)) && return $rc
  local parallel=()
  "$PY" -c "import xdist" 2>/dev/null && parallel=(-n 4)
  "$PY" -m pytest -q -p no:cacheprovider "${parallel[@]}" -m "not slow and not gpu and not ray" \
    tests/test_device_placement.py tests/test_embedded_engine.py tests/test_shared_prefix.py tests/test_fused_head.py \
    tests/test_vocab_logprobs.py tests/test_kv_cache_budget.py tests/test_guards.py tests/test_rollout.py \
    tests/test_algorithms_update.py tests/test_decode_graphs.py || rc=1
  return $rc
}

calculator_run() {  # one precision: the example's SFT warm-up then its GRPO run, on $DEVICE
  local name=$1 rc=0
  local train=${TRAIN_PRECISION[$name]} engine=${ENGINE_PRECISION[$name]}
  # shellcheck disable=SC2046  # quick's words split on purpose
  thermik sft @ examples/calculator/sft.toml --name "calc-sft-$name" --output_dir "$RUNS" \
    --model.path "$RUNS/calc-init" --train_path "$RUNS/calc-data/sft.jsonl" --model.device "$DEVICE" \
    --model.train_precision "$train" --progress false \
    $(quick --max_steps 4 --min_steps 2 --eval_every 2 --eval_size 4 --rollout.max_generate_length 16) || return 1
  # 64 of the example's 160 GRPO steps, held-out evaluations before, at 32 and after: a 1M model is latency-bound on a
  # GPU (1.4-1.8 s per step on an H200 with both precisions side by side), and 120 steps take longer than the stage's 240 s.
  # shellcheck disable=SC2046
  thermik rl @ examples/calculator/rl.toml --name "calc-rl-$name" --output_dir "$RUNS" \
    --model.path "$RUNS/calc-sft-$name/model" --model.device "$DEVICE" --model.train_precision "$train" \
    --inference.precision "$engine" --monitor.progress false --trainer.steps 64 --eval.every 32 \
    $(quick --trainer.steps 2 --trainer.prompts_per_step 2 --trainer.group_size 2 --eval.size 4 --eval.every 0 \
      --rollout.max_generate_length 16) \
    || rc=1
  return $rc
}

stage_calculator() {
  # Both precisions at once: a tiny model leaves the GPU mostly idle (their wall times overlap; the logs say each).
  calculator_run float32 >"$LOGS/calculator_float32.log" 2>&1 &
  local f32=$!
  calculator_run bf16 >"$LOGS/calculator_bf16.log" 2>&1 &
  local bf16=$!
  local rc=0
  wait $f32 || rc=1
  wait $bf16 || rc=1
  tail -n 25 "$LOGS/calculator_float32.log" "$LOGS/calculator_bf16.log"
  return $rc
}

stage_mfu() {
  local rc=0
  if ((QUICK)); then
    "$PY" benchmarks/trainer_mfu.py --device "$DEVICE" --preset qwen2-1m --only full --batch 2 --seq 16 --rounds 1 \
      --peak-matmul 128 --peak-repeats 1 || rc=1
    return $rc
  fi
  "$PY" benchmarks/trainer_mfu.py --device "$DEVICE" --shape qwen2.5-0.5b --only full --batch 8 --seq 512 --rounds 3 \
    --peak-matmul 8192 --peak-repeats 3 || rc=1
  # The RL size: 16 rows of 2,048 tokens in one micro-batch, bf16-mixed, also with activation checkpointing;
  # then with trainer.compile (its warm-up step compiles; last, so a slow compile cuts nothing else).
  local rl_size=(--device "$DEVICE" --shape qwen2.5-0.5b --only full --batch 16 --seq 2048 --micro 16 --rounds 3
    --precisions bf16-mixed --peak-matmul 8192 --peak-repeats 3)
  "$PY" benchmarks/trainer_mfu.py "${rl_size[@]}" --speed checkpointing || rc=1
  "$PY" benchmarks/trainer_mfu.py "${rl_size[@]}" --speed compile || rc=1
  return $rc
}

stage_generate() {
  local rc=0
  if ((QUICK)); then
    "$PY" benchmarks/engine_vs_hf.py --device "$DEVICE" --preset qwen2-1m --batch 4 --max-tokens 4 --repeats 1 \
      --only throughput parity --no-roofline || rc=1
    return $rc
  fi
  # The engine as built by default (decode steps replayed as CUDA graphs on a GPU), then the parity: greedy tokens of
  # the graphs vs the same step run eagerly and vs the native forward, logprobs vs transformers (engine_vs_hf.py).
  "$PY" benchmarks/engine_vs_hf.py --device "$DEVICE" --shape qwen2.5-0.5b --dtype bfloat16 --batch 64 \
    --max-tokens 128 --prompt-tokens 64 --repeats 2 --only throughput parity --no-roofline || rc=1
  return $rc
}

stage_rl_sync() {
  # 5 GRPO steps, weights pushed into the engine after each (checksummed), the parity probe every step; from the
  # float32 SFT warm-up when it exists. Synchronous bf16 and float32, then one-step-off asynchronous bf16. A bfloat16
  # engine's probe gap to the float32 trainer is bfloat16 arithmetic (0.2-2 on a trained model, docs/reliability.md):
  # its runs take a limit that records the gap; the checksum checks their weights.
  local model=$RUNS/calc-sft-float32/model rc=0 name
  [[ -d $model ]] || model=$RUNS/calc-init
  for name in bf16 float32 bf16-async; do
    local kind=${name%-async} async=0 limit=0.1
    [[ $name == *-async ]] && async=1
    [[ $kind == bf16 ]] && limit=5
    # shellcheck disable=SC2046
    thermik rl @ examples/calculator/rl.toml --name "rl-sync-$name" --output_dir "$RUNS" --model.path "$model" \
      --model.device "$DEVICE" --model.train_precision "${TRAIN_PRECISION[$kind]}" \
      --inference.precision "${ENGINE_PRECISION[$kind]}" --trainer.max_async_steps "$async" \
      --trainer.steps "$( ((QUICK)) && echo 2 || echo 5)" --guards.parity_every 1 \
      --guards.parity_max_abs_diff "$limit" --eval.before false --eval.size 16 --checkpoint.every 0 \
      --monitor.progress false \
      $(quick --trainer.prompts_per_step 2 --trainer.group_size 2 --eval.size 2 --rollout.max_generate_length 16) \
      || rc=1
  done
  return $rc
}

stage_packing() {
  # Packed SFT forward+backward: padded vs varlen (one row; flash varlen with flash-attn, else per-sequence SDPA)
  # vs the masked rows, equal losses checked (benchmarks/packing.py).
  if ((QUICK)); then
    "$PY" benchmarks/packing.py --device "$DEVICE" --preset qwen2-1m --batch 6 --min-len 4 --max-len 48 --repeats 1
    return
  fi
  "$PY" benchmarks/packing.py --device "$DEVICE" --preset qwen2-20m --batch 32 --min-len 64 --max-len 2048 --repeats 3
}

stage_chunked_head() {
  # Peak memory and time of the lm head + logprobs + entropy, full logits vs chunks (benchmarks/chunked_head.py);
  # on a GPU at Qwen2.5-0.5B's head and the RL size's 16 x 2,048 tokens.
  if ((QUICK)); then
    "$PY" benchmarks/chunked_head.py --device "$DEVICE" --tokens 256 --vocab 4096 --hidden 64 --chunk 64
    return
  fi
  "$PY" benchmarks/chunked_head.py --device "$DEVICE" --dtype bfloat16 --tokens 32768 --vocab 151936 --hidden 896 \
    --chunk 4096
}

stage_main_job() {
  # The real-model example on this device: SmolLM2-135M-Instruct on word problems, zero-shot eval -> SFT -> GRPO ->
  # held-out table with each stage's wall time. Needs the imported model directory (--smollm2 DIR: the machine has
  # no network); without one the stage says so and passes. Not in the default stages: run it with --stages main_job.
  if [[ -z $SMOLLM2 ]]; then
    echo "main_job: skipped, no SmolLM2-135M-Instruct directory (--smollm2 DIR, from thermik model import)"
    return 0
  fi
  # shellcheck disable=SC2046
  MODEL=$SMOLLM2 THERMIK_MODEL__DEVICE=$DEVICE bash examples/smollm2_word_problems/run.sh $(quick --quick)
}

if [[ ${1:-} == __stage ]]; then  # re-entry: `timeout` runs one stage of this script in a child shell (cwd: ROOT)
  shift
  "stage_$1" 2>&1
  exit $?
fi

SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
ROOT=$(dirname "$(dirname "$SELF")")
CALLER=$PWD
DEVICE=cuda
OUT_DIR=${OUT:-$ROOT/.gpu-check}
WHEELS=""
QUICK=0
STAGES="env,tests,calculator,generate,mfu,rl_sync,packing,chunked_head"
SMOLLM2=""
BUDGET=440
KEEP=0
while (($#)); do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --stages) STAGES=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --smollm2) SMOLLM2=$2; shift 2 ;;
    *) echo "gpu_check: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

absolute() { [[ $1 == /* ]] && echo "$1" || echo "$CALLER/$1"; }
OUT_DIR=$(absolute "$OUT_DIR")
[[ -n $WHEELS ]] && WHEELS=$(absolute "$WHEELS")
cd "$ROOT" || exit 2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thermik-gpu-check.XXXXXX")
RUNS=$WORK/runs
LOGS=$WORK/logs
mkdir -p "$RUNS" "$LOGS" "$OUT_DIR"
[[ -n $SMOLLM2 ]] && SMOLLM2=$(absolute "$SMOLLM2")
export DEVICE QUICK ROOT RUNS LOGS WORK SMOLLM2
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export XDG_CACHE_HOME=$WORK/cache MPLCONFIGDIR=$WORK/mpl  # the C kernels' build cache and matplotlib's, private
export PY=${PYTHON:-python3}

if [[ -n $WHEELS ]]; then
  # Missing pure-Python packages (and two binary ones) travel as wheels; they go to a private directory only.
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
      "$WHEELS"/*.whl >"$LOGS/wheels.log" 2>&1; then
    echo "gpu_check: installing the wheels in $WHEELS failed (see $LOGS/wheels.log)" >&2
  fi
  export PYTHONPATH=$ROOT/src:$WORK/site${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
fi

# Each stage's own limit (seconds) on a GPU. tests and calculator run side by
# side (neither keeps a GPU busy); the benchmarks and the RL runs after them have the GPU to themselves.
declare -A LIMIT=([env]=60 [tests]=240 [calculator]=240 [generate]=120 [mfu]=240 [rl_sync]=90 [packing]=60
  [chunked_head]=60 [main_job]=540)
if ((QUICK)); then  # the dry run's tiny sizes on a CPU shared with other work: five times the limits
  for stage in "${!LIMIT[@]}"; do LIMIT[$stage]=$((LIMIT[$stage] * 5)); done
fi
START=$(date +%s)
printf 'stage\trc\tseconds\tlimit\n' >"$LOGS/stages.tsv"

run_stage() {  # run_stage NAME: time-boxed, logged, never fatal
  local name=$1 left limit t0 rc
  [[ ,$STAGES, == *,$name,* ]] || return 0
  left=$((BUDGET - ($(date +%s) - START)))
  limit=$((LIMIT[$name] < left ? LIMIT[$name] : left))
  if ((limit < 5)); then
    printf '%s\t%s\t0\t%s\n' "$name" "no-time" "$limit" >>"$LOGS/stages.tsv"
    echo "== $name: skipped, the budget is spent"
    return 0
  fi
  echo "== $name (limit ${limit}s)"
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" bash "$SELF" __stage "$name" >"$LOGS/$name.log" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  printf '%s\t%s\t%d.%d\t%s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$limit" >>"$LOGS/stages.tsv"
  echo "== $name: rc $rc ($( ((rc == 124 || rc == 137)) && echo "timed out" || echo done), ${ms} ms)"
}

run_stage env
run_stage tests &
run_stage calculator
wait
for stage in generate mfu rl_sync packing chunked_head main_job; do
  run_stage "$stage"
done

"$PY" scripts/gpu_check_report.py "$WORK" "$OUT_DIR"
report=$?
tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs $(cd "$WORK" && find runs -maxdepth 2 \
  \( -name metrics.jsonl -o -name sft_result.json -o -name 'eval_*.json' -o -name config.toml \) 2>/dev/null)
cat "$OUT_DIR/summary.md"
failed=0
awk -F'\t' 'NR > 1 && $2 != "0" { bad = 1 } END { exit bad }' "$LOGS/stages.tsv" || failed=1
if ((KEEP)); then
  echo "gpu_check: results in $OUT_DIR (work directory $WORK)"
else
  rm -rf "$WORK"
  echo "gpu_check: results in $OUT_DIR"
fi
((failed)) && exit 1
exit "$report"
