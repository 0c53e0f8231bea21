"""Time to reward: wall time until held-out reward first reaches targets, thermik (sync, async) vs TRL GRPOTrainer.

All sides start from the same SFT checkpoint (a `thermik sft` output directory, loaded by TRL's side with
transformers' `AutoModelForCausalLM`) and train on single-turn `reverse_text` prompts with the same reward, the same
batch (prompts x group per step), max new tokens, temperature 1, AdamW (torch, betas 0.9/0.98, no weight decay),
lr, constant schedule, clip 0.2/0.28, token-mean loss, no KL, one optimizer step per batch, float32, thread count
(benchmarks/grpo_vs_trl.py holds the shared settings). thermik runs its real step (`setup` + `LocalMode.step`: weight
sync to its engine included), synchronously and with `trainer.max_async_steps = 1` (in-flight weight updates);
TRL runs `GRPOTrainer.train()` with `use_vllm=False`.

Every `--eval-every` steps (and once before the first step, untimed) one scorer checks every side: the policy's
weights are copied into one transformers model that samples the held-out problems (the `eval` split, the same rows
for every side) with `generate` at temperature 1 from a fixed seed, scored by the reverse_text reward; the
held-out reward is the mean. The clock runs from just before the first step (after each side's set-up) and stops
while the scorer runs, on every side alike. A side stops at the first check that reaches the highest of `--targets`
or after `--steps` steps. Printed: per side the check curve, and per target each side's time to reach it and the
ratio of TRL's time over thermik's.

    bash examples/reverse_text/run.sh   # or only its SFT stage: builds runs/reverse-sft/model
    python benchmarks/time_to_reward_trl.py --model runs/reverse-sft/model --targets 0.5 0.55 0.6 --steps 50
    # on a loaded machine add --threads 1: a two-thread OpenMP team stalls whenever one thread is preempted

Needs the `bench` extra (`pip install -e .[bench]`) for the TRL half.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from grpo_vs_trl import ENV, BenchSpec, reverse_text_reward, thermik_config, trl_config
from transformers import AutoModelForCausalLM

from thermik.models.loading import load_tokenizer
from thermik.runs.local import LocalMode, setup
from thermik.tasks.registry import generate_rows
from thermik.tasks.reverse_text.env import reversal_reward

SIDES = ("trl", "thermik-sync", "thermik-async")
_NONE = nullcontext()


class HeldOutScorer:
    """One transformers model that samples the held-out prompts with each side's current weights."""

    def __init__(self, model_dir: Path, size: int, max_tokens: int, seed: int) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
        self.tokenizer = load_tokenizer(model_dir)
        rows = generate_rows(ENV, size, seed, split="eval")
        self.truths = [r["reward_spec"]["ground_truth"] for r in rows]
        texts = [
            self.tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows
        ]
        self.inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        self.max_tokens, self.seed = max_tokens, seed

    @torch.no_grad()
    def score(self, weights: dict[str, torch.Tensor]) -> float:
        self.model.load_state_dict(weights)
        torch.manual_seed(self.seed)  # the same random stream for every check: differences come from the weights
        out = self.model.generate(
            **self.inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=self.max_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
        )  # fmt: skip
        texts = self.tokenizer.batch_decode(out[:, self.inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        return sum(reversal_reward(t, gt) for t, gt in zip(texts, self.truths, strict=True)) / len(texts)


@dataclass
class Curve:
    """A side's held-out checks: (steps done, training wall seconds with the checks excluded, held-out reward)."""

    side: str
    target: float  # the side stops at the first check that reaches it
    t0: float = 0.0
    paused: float = 0.0
    checks: list[tuple[int, float, float]] = field(default_factory=list)

    def start(self) -> None:
        self.t0, self.paused = time.perf_counter(), 0.0

    def check(
        self, scorer: HeldOutScorer, step: int, weights: dict[str, torch.Tensor], hold: AbstractContextManager = _NONE
    ) -> bool:
        """Score the weights after `step` steps off the clock, inside `hold`; True once the target is reached."""
        t_pause = time.perf_counter()
        elapsed = t_pause - self.t0 - self.paused if self.t0 else 0.0  # the check before the clock starts: 0 s
        with hold:
            reward = scorer.score(weights)
        self.checks.append((step, elapsed, reward))
        print(f"  {self.side:<14} step {step:>3}  {elapsed:>7.1f} s  held-out reward {reward:.3f}", flush=True)
        self.paused += time.perf_counter() - t_pause
        return reward >= self.target

    def time_to(self, target: float) -> float | None:
        return next((s for step, s, r in self.checks if step > 0 and r >= target), None)


def run_thermik(spec: BenchSpec, scorer: HeldOutScorer, curve: Curve, every: int, async_steps: int) -> Curve:
    cfg = thermik_config(spec)
    cfg = cfg.model_copy(
        update={
            "name": curve.side,
            "model": cfg.model.model_copy(update={"train_precision": "float32"}),
            "inference": cfg.inference.model_copy(update={"precision": "float32"}),
            "trainer": cfg.trainer.model_copy(update={"max_async_steps": async_steps, "steps": spec.steps}),
        }
    )
    torch.set_num_threads(spec.threads)
    loop = asyncio.new_event_loop()
    mode = loop.run_until_complete(_local_mode(cfg))
    # The engine decodes in its own thread, which would go on sampling the asynchronous producer's running requests
    # while the clock is stopped: its model lock (held per scheduler iteration) keeps it still during each check.
    engine_still = mode.rollout_ctx.engine._model_lock
    try:
        curve.check(scorer, 0, mode.learner.policy.state_dict())
        curve.start()
        loop.run_until_complete(mode.start())
        for step in range(spec.steps):
            loop.run_until_complete(mode.step(step))
            weights = mode.learner.policy.state_dict()
            if (step + 1) % every == 0 and curve.check(scorer, step + 1, weights, engine_still):
                break
    finally:
        loop.run_until_complete(mode.stop())
        loop.run_until_complete(mode.run.close())
        loop.close()
    return curve


async def _local_mode(cfg: Any) -> LocalMode:
    return LocalMode(setup(cfg))


def run_trl(spec: BenchSpec, scorer: HeldOutScorer, curve: Curve, every: int) -> Curve:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    class HeldOutChecks(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            curve.check(scorer, 0, model.state_dict())
            curve.start()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if state.global_step % every == 0 and curve.check(scorer, state.global_step, model.state_dict()):
                control.should_training_stop = True

    torch.set_num_threads(spec.threads)
    rows = generate_rows(ENV, spec.train_rows, spec.seed, split="train")
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_spec"]["ground_truth"]} for r in rows]
    )
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir, local_files_only=True, dtype=torch.float32)
    config = trl_config(spec)
    config.max_steps = spec.steps  # grpo_vs_trl's config adds a warm-up step
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reverse_text_reward,
        args=config,
        train_dataset=dataset,
        processing_class=load_tokenizer(spec.model_dir),
        callbacks=[HeldOutChecks()],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return curve


def format_report(curves: list[Curve], spec: BenchSpec, args: argparse.Namespace) -> str:
    lines = [
        f"reverse_text from {args.model}: {spec.prompts} prompts x {spec.group} per step, max {spec.max_tokens} "
        f"tokens, lr {spec.lr}, {spec.threads} threads; held-out: {args.eval_size} problems at T=1 every "
        f"{args.eval_every} steps; budget {spec.steps} steps",
        f"{'side':<14} {'start':>6} {'best':>6} {'steps':>6} {'s/step':>7}"
        + "".join(f" {'to ' + str(t):>10}" for t in args.targets),
    ]
    for c in curves:
        start, best = c.checks[0][2], max(r for _, _, r in c.checks)
        last_step, last_s, _ = c.checks[-1]
        s_step = last_s / last_step if last_step else float("nan")
        reached = [c.time_to(t) for t in args.targets]
        shown = "".join(f" {f'{s:.1f} s' if s is not None else f'>{last_s:.0f} s':>10}" for s in reached)
        lines.append(f"{c.side:<14} {start:>6.3f} {best:>6.3f} {last_step:>6} {s_step:>7.2f}{shown}")
    trl = next((c for c in curves if c.side == "trl"), None)
    for c in curves:
        if trl is None or c is trl:
            continue
        ratios = [(t, trl.time_to(t), c.time_to(t)) for t in args.targets]
        shown = ", ".join(f"{t}: {a / b:.2f}x" if a and b else f"{t}: -" for t, a, b in ratios)
        lines.append(f"time to held-out reward, trl / {c.side}: {shown}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=Path("runs/reverse-sft/model"), help="the SFT checkpoint")
    p.add_argument(
        "--targets", type=float, nargs="+", default=[0.5, 0.55, 0.6],
        help="held-out mean rewards to time; a side stops at the highest",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=60, help="step budget per side")
    p.add_argument("--prompts", type=int, default=32, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=32, help="max new tokens (training and held-out)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (every side)")
    p.add_argument("--eval-size", type=int, default=200, help="held-out problems per check")
    p.add_argument("--eval-every", type=int, default=5, help="steps between held-out checks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="which sides to run, in order")
    args = p.parse_args(argv)
    if not (args.model / "config.json").exists():
        p.error(f"--model {args.model} is not a model directory; run `bash examples/reverse_text/run.sh` first")
    if min(args.steps, args.prompts, args.max_tokens, args.eval_size, args.eval_every, args.threads) < 1:
        p.error("--steps, --prompts, --max-tokens, --eval-size, --eval-every and --threads must be >= 1")
    if args.group < 2:
        p.error(f"--group must be >= 2 (GRPO needs a group to compare), got {args.group}")
    return args


def main(argv: list[str] | None = None) -> list[Curve]:
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    curves = []
    with tempfile.TemporaryDirectory(prefix="thermik-ttr-") as tmp:
        spec = BenchSpec(
            args.model.resolve(), Path(tmp), args.steps, args.prompts, args.group, args.max_tokens, args.lr,
            args.seed, args.threads,
        )  # fmt: skip
        scorer = HeldOutScorer(spec.model_dir, args.eval_size, args.max_tokens, args.seed)
        for side in dict.fromkeys(args.sides):
            curve = Curve(side, max(args.targets))
            if side == "trl":
                curves.append(run_trl(spec, scorer, curve, args.eval_every))
            else:
                curves.append(run_thermik(spec, scorer, curve, args.eval_every, int(side == "thermik-async")))
            gc.collect()
    print(format_report(curves, spec, args))
    return curves


if __name__ == "__main__":
    main()
