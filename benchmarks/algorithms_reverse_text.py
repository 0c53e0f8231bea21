"""The algorithm library on reverse_text: grpo, dr_grpo, rloo, gspo, cispo and ppo+gae (and LoRA with --lora) at the
same seed and budget, from the same SFT warm-up, in one process; prints the final held-out reward of each.

Every run is `thermik rl @ examples/reverse_text/rl.toml` (32 prompts x 8 samples, lr 1e-3, temperature 1) with
only the algorithm section (and, for LoRA, the lora section and the learning rate) changed. The LoRA row trains
rank-16 adapters on every projection plus the RMSNorm weights (lora.modules_to_save) at lr 2.5e-3. The warm-up is
`examples/reverse_text/sft.toml` on a fresh qwen2-1m (as examples/reverse_text/run.sh does), or --sft-model.
The held-out reward is the mean over --eval-size problems sampled at temperature 1 after the last step.

    python benchmarks/algorithms_reverse_text.py --lora                   # the full budget: hours on 2 CPU cores
    python benchmarks/algorithms_reverse_text.py --steps 3 --eval-size 16 --sft-steps 20 --lora   # a smoke run

Runs live in --out (default runs/algorithms-reverse-text/<name>); a rerun resumes each from its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thermik.config.loader import load_config
from thermik.config.schema import RunConfig, SFTConfig
from thermik.models.presets import init_model
from thermik.runs.local import run_rl
from thermik.runs.sft import run_sft
from thermik.tasks.synthesize import synthesize

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "reverse_text"
TARGET = 0.8  # every algorithm should reach at least this held-out reward

# One row per algorithm: the [algorithm] keys (dotted) that differ from the defaults (GRPO advantages, PPO clip loss).
VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "dr_grpo": {"advantage.type": "dr_grpo"},
    "rloo": {"advantage.type": "rloo"},
    "gspo": {"loss.type": "gspo", "reduction.type": "sequence_mean"},  # GSPO's paper reduces per sequence
    "cispo": {"loss.type": "cispo"},
    "ppo_gae": {"advantage.type": "gae", "advantage.lam": 0.95},
}
LORA_VARIANT = "grpo_lora"


@dataclass
class Result:
    name: str
    reward: float  # held-out mean reward after training
    success: float
    train_reward: float  # mean training reward of the last 10% of steps
    step_s: float


def warm_up(args: argparse.Namespace) -> Path:
    """The SFT warm-up of examples/reverse_text (sft.toml) on a fresh qwen2-1m (reused when --out has one);
    returns the model directory."""
    model = args.out / "sft" / "model"
    if (model / "config.json").is_file():
        print(f"SFT warm-up: reusing {model}")
        return model
    init = init_model("qwen2-1m", args.out / "init", seed=args.seed, overwrite=True)
    _, sft_rows = synthesize("reverse_text", args.train_size, args.out / "data", seed=args.seed)
    argv = ["@", str(EXAMPLE / "sft.toml"), "--name=sft", f"--output_dir={args.out}", f"--model.path={init}"]
    argv += [f"--train_path={sft_rows}", f"--seed={args.seed}", "--progress=false"]
    if args.sft_steps is not None:
        argv.append(f"--max_steps={args.sft_steps}")
    result = run_sft(load_config(SFTConfig, argv, env={}))
    print(f"SFT warm-up: {result['steps']} steps, held-out reward {result['reward']}")
    return model


def steps_of(args: argparse.Namespace, name: str) -> int:
    """The LoRA row has its own budget (--lora-steps): the issue asks the algorithm rows for one shared budget."""
    return args.lora_steps if name == LORA_VARIANT else args.steps


def rl_argv(args: argparse.Namespace, name: str, model: Path) -> list[str]:
    """`thermik rl` arguments of one row: the example's config, the shared budget, the row's own keys."""
    argv = ["@", str(EXAMPLE / "rl.toml"), f"--name={name}", f"--output_dir={args.out}", f"--model.path={model}"]
    argv += [f"--seed={args.seed}", f"--trainer.steps={steps_of(args, name)}", f"--eval.size={args.eval_size}"]
    argv += [f"--trainer.prompts_per_step={args.prompts}", f"--trainer.group_size={args.group}"]
    argv += ["--eval.before=false", "--monitor.progress=false", f"--checkpoint.every={args.checkpoint_every}"]
    argv.append(f"--data.train_path={args.out / 'data' / 'rows.jsonl'}")
    if name == LORA_VARIANT:
        argv += ["--lora.enabled=true", f"--lora.rank={args.lora_rank}", f"--lora.alpha={args.lora_alpha}"]
        argv.append(f"--trainer.optimizer.lr={args.lora_lr}")
        argv.append(f"--lora.modules_to_save={json.dumps(args.lora_modules_to_save)}")
    else:
        argv += [f"--algorithm.{k}={v}" for k, v in VARIANTS[name].items()]
    return argv


def train(args: argparse.Namespace, name: str, model: Path) -> Result:
    cfg = load_config(RunConfig, rl_argv(args, name, model), env={})
    after = run_rl(cfg)["after"]
    records = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step" in r]
    tail = steps[-max(1, len(steps) // 10) :]
    return Result(
        name,
        after["reward"],
        after["success"],
        statistics.mean(r["reward/mean"] for r in tail),
        statistics.mean(r["time/step"] for r in steps),
    )


def format_table(results: list[Result], args: argparse.Namespace) -> str:
    head = f"reverse_text, {args.steps} steps of {args.prompts} x {args.group} samples, seed {args.seed}"
    if any(r.name == LORA_VARIANT for r in results):
        head += f" ({LORA_VARIANT}: {args.lora_steps} steps)"
    lines = [head, f"{'algorithm':<12}{'held-out reward':>17}{'success':>9}{'train reward':>14}{'s/step':>8}  >= 0.8"]
    for r in results:
        reached = "yes" if r.reward >= TARGET else "no"
        lines.append(
            f"{r.name:<12}{r.reward:>17.3f}{r.success:>9.3f}{r.train_reward:>14.3f}{r.step_s:>8.2f}  {reached}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=800, help="RL steps per algorithm (ppo+gae, the slowest, needs ~800)")
    p.add_argument("--eval-size", type=int, default=200, help="held-out problems (sampled at temperature 1)")
    p.add_argument("--prompts", type=int, default=32, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--algorithms", nargs="*", default=list(VARIANTS), choices=list(VARIANTS), metavar="NAME")
    p.add_argument("--lora", action="store_true", help=f"add a row '{LORA_VARIANT}': GRPO training LoRA adapters")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=16.0, help="LoRA alpha (the update is scaled by alpha / rank)")
    p.add_argument("--lora-steps", type=int, default=1000, help="RL steps of the LoRA row")
    p.add_argument(
        "--lora-modules-to-save", nargs="*", default=["norm"], metavar="NAME", help="lora.modules_to_save (the norms)"
    )
    p.add_argument("--lora-lr", type=float, default=2.5e-3, help="learning rate of the LoRA row")
    p.add_argument("--sft-model", type=Path, help="start from this model directory instead of a new SFT warm-up")
    p.add_argument("--sft-steps", type=int, help="cap on SFT warm-up steps (default: sft.toml's early stop)")
    p.add_argument("--train-size", type=int, default=4000, help="synthesized training problems")
    p.add_argument("--checkpoint-every", type=int, default=50, help="checkpoint each run every k steps (resume)")
    p.add_argument("--out", type=Path, default=Path("runs/algorithms-reverse-text"))
    args = p.parse_args(argv)
    if min(args.steps, args.lora_steps, args.eval_size, args.prompts, args.train_size) < 1 or args.group < 2:
        p.error("--steps, --lora-steps, --eval-size, --prompts and --train-size must be >= 1 and --group >= 2")
    if args.sft_model is not None and not (args.sft_model / "config.json").is_file():
        p.error(f"--sft-model {args.sft_model} is not a model directory (no config.json)")
    return args


def main(argv: list[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    model = args.sft_model
    if model is None:
        model = warm_up(args)
    elif not (args.out / "data" / "rows.jsonl").is_file():
        synthesize("reverse_text", args.train_size, args.out / "data", seed=args.seed)
    names = [*args.algorithms, *([LORA_VARIANT] if args.lora else [])]
    results = []
    for name in names:  # each row's result is printed and kept in --out/results.jsonl as soon as it finishes
        results.append(train(args, name, model))
        with (args.out / "results.jsonl").open("a") as f:
            f.write(json.dumps({**results[-1].__dict__, "steps": steps_of(args, name), "seed": args.seed}) + "\n")
        print(format_table(results, args), flush=True)
    return results


if __name__ == "__main__":
    main()
