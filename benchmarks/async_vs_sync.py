"""Synchronous against asynchronous GRPO on the calculator example, same samples, one process.

Runs `thermik rl @ examples/calculator/rl.toml` (the main job's RL half, from its SFT checkpoint) with
trainer.max_off_policy_steps = 0 (synchronous), then each value of --off-policy, for --steps steps each, with
the calculator MCP server sleeping --latency seconds per tool call (real agent tools are slow: search APIs,
code execution). Prints the mean wall time per step (after the first) and the held-out success after training
(--eval-size problems sampled at temperature 1), and the speed ratio of each async run over the synchronous.

    bash examples/calculator/run.sh                      # once: builds runs/calculator-sft/model
    python benchmarks/async_vs_sync.py --latency 0.3 --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from thermik.config.loader import load_config
from thermik.config.schema import RunConfig
from thermik.training.rl import run_rl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "calculator" / "rl.toml"


def run(args: argparse.Namespace, off_policy: int, out: Path) -> dict[str, float]:
    argv = [
        "@",
        str(EXAMPLE),
        f"--name=async-{off_policy}",
        f"--output_dir={out}",
        f"--model.path={args.model}",
        f"--trainer.steps={args.steps}",
        f"--trainer.max_off_policy_steps={off_policy}",
        f"--env.tool_latency_s={args.latency}",
        f"--eval.size={args.eval_size}",
        "--eval.before=false",
        "--checkpoint.every=0",
        "--monitor.progress=false",
        "--monitor.save_trajectories_every=0",
    ]
    cfg = load_config(RunConfig, argv, env={})
    result = run_rl(cfg)
    records = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["time/step"] for r in records if "time/step" in r][1:]
    stale = [r["async/staleness_mean"] for r in records if "async/staleness_mean" in r]
    return {
        "step_s": statistics.mean(steps),
        "success": result["after"]["success"],
        "reward": float(statistics.mean(r["reward/mean"] for r in records if "reward/mean" in r)),
        "staleness": statistics.mean(stale) if stale else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/calculator-sft/model", help="the SFT checkpoint to start from")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.3, help="seconds the MCP server sleeps per tool call")
    parser.add_argument("--off-policy", type=int, nargs="+", default=[1, 2], help="max_off_policy_steps values")
    parser.add_argument("--eval-size", type=int, default=200)
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        parser.error(f"--model {args.model} is not a model directory; run `bash examples/calculator/run.sh` first")
    if args.steps < 2 or any(k < 1 for k in args.off_policy):
        parser.error("--steps must be >= 2 and every --off-policy value >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        results = {k: run(args, k, Path(tmp)) for k in [0, *args.off_policy]}
    base = results[0]["step_s"]
    print(f"calculator, {args.steps} steps of 12 x 8 samples, tool latency {args.latency} s per call")
    print(f"{'mode':<24}{'s/step':>8}{'speed-up':>10}{'train reward':>14}{'held-out success':>18}{'staleness':>11}")
    for k, r in results.items():
        mode = "synchronous" if k == 0 else f"max_off_policy_steps={k}"
        print(
            f"{mode:<24}{r['step_s']:>8.2f}{base / r['step_s']:>9.2f}x{r['reward']:>14.3f}"
            f"{r['success']:>18.3f}{r['staleness']:>11.2f}"
        )


if __name__ == "__main__":
    main()
