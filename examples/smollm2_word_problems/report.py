"""The example's before/after table: held-out success ± standard error and the wall time of each stage."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from thermik.monitor.progress import print_table
from thermik.rollout.evaluation import EvalResult


def read_eval(path: Path) -> EvalResult:
    return EvalResult(**json.loads(path.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--times", type=Path, required=True, help="jsonl of {stage, seconds} written by run.sh")
    parser.add_argument("--zero-shot", type=Path, required=True, help="run directory of `thermik eval` on the base")
    parser.add_argument("--rl", type=Path, required=True, help="run directory of `thermik rl`")
    parser.add_argument("--task", default="word problems", help="the task's name in the table's title")
    args = parser.parse_args()
    times = {r["stage"]: r["seconds"] for r in map(json.loads, args.times.read_text().splitlines())}
    evals = [
        ("base model, zero-shot", read_eval(args.zero_shot / "eval.json"), "zero-shot"),
        ("SFT warm-up", read_eval(args.rl / "eval_before.json"), "sft"),
        ("after GRPO", read_eval(args.rl / "eval_after.json"), "grpo"),
    ]
    rows = [
        [name, f"{r.success:.3f} ± {r.success_se:.3f}", f"{r.turns:.2f}", str(r.n), f"{times.get(stage, 0) / 60:.1f}"]
        for name, r, stage in evals
    ]
    title = f"SmolLM2-135M-Instruct, held-out {args.task} (temperature 1)"
    print_table(title, ["policy", "success ± s.e.", "mean turns", "n", "stage minutes"], rows)
    gain = evals[2][1].success - evals[1][1].success
    gain_se = (evals[2][1].success_se ** 2 + evals[1][1].success_se ** 2) ** 0.5
    print(f"GRPO over SFT: {gain:+.3f} ± {gain_se:.3f}; whole script {sum(times.values()) / 60:.1f} min")


if __name__ == "__main__":
    main()
