"""The thinking calculator's before/after table and how its step-wise samples looked.

Held-out success ± standard error of the SFT checkpoint (eval_before.json) and of the policy after GRPO
(eval_after.json); from the RL run's metrics.jsonl the mean over steps of step_wise/samples_per_episode (above 1:
episodes that broke the token prefix and trained as several samples) and thinking/tokens_per_turn, and the training
reward of the first and last steps, the median step time; with --times (run.sh's jsonl of {stage, seconds}) the wall
time of each stage.

    python examples/thinking_calculator/report.py runs/thinking-calculator-rl \
        --times runs/thinking-calculator-times.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import fmean, median

from thermik.rollout.evaluation import EvalResult

STEP_METRICS = ("step_wise/samples_per_episode", "thinking/tokens_per_turn")


def read_eval(path: Path) -> EvalResult:
    return EvalResult(**json.loads(path.read_text()))


def report(run: Path) -> dict[str, float]:
    before, after = read_eval(run / "eval_before.json"), read_eval(run / "eval_after.json")
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [s for s in steps if STEP_METRICS[0] in s]  # the training steps (eval lines have none)
    out = {
        "sft": before.success,
        "sft_se": before.success_se,
        "grpo": after.success,
        "grpo_se": after.success_se,
        "gain": after.success - before.success,
        "problems": float(after.problems or after.n),
        "steps": float(len(steps)),
    }
    for key in STEP_METRICS:
        out[key] = fmean(s.get(key, 0.0) for s in steps) if steps else 0.0
    out["time/step"] = median(s["time/step"] for s in steps) if steps else 0.0
    out["reward_first"], out["reward_last"] = (steps[0]["reward/mean"], steps[-1]["reward/mean"]) if steps else (0, 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="run directory of `thermik rl`")
    parser.add_argument("--times", type=Path, help="jsonl of {stage, seconds} written by run.sh")
    args = parser.parse_args()
    r = report(args.run)
    if args.times is not None:
        for line in args.times.read_text().splitlines():
            stage = json.loads(line)
            r[f"stage/{stage['stage']}"] = float(stage["seconds"])
        print("stages: " + ", ".join(f"{k.removeprefix('stage/')} {v:.0f} s" for k, v in r.items() if "stage/" in k))
    print(f"held-out calculator_thinking, {r['problems']:.0f} problems sampled at temperature 1")
    print(f"  SFT checkpoint: {r['sft']:.3f} ± {r['sft_se']:.3f}")
    print(f"  after GRPO:     {r['grpo']:.3f} ± {r['grpo_se']:.3f}  (gain {r['gain']:+.3f})")
    print(
        f"GRPO, {r['steps']:.0f} steps: step_wise/samples_per_episode {r[STEP_METRICS[0]]:.2f}, "
        f"thinking/tokens_per_turn {r[STEP_METRICS[1]]:.2f}, {r['time/step']:.2f} s/step (median), "
        f"training reward {r['reward_first']:.3f} -> {r['reward_last']:.3f}"
    )
    print(json.dumps({"thinking_calculator": r}))


if __name__ == "__main__":
    main()
