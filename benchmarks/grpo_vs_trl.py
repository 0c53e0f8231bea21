"""GRPO throughput, thermik vs TRL's GRPOTrainer, on the same tiny local model in one process.

Both sides: the same freshly initialised preset model (thermik.models.presets.init_model), tokenizer and chat
template; reverse_text prompts from thermik.tasks.registry; the reverse_text similarity reward; the same batch
(prompts x group completions per step), max completion length, temperature 1, lr, AdamW (torch, not fused),
constant schedule, clip 0.2/0.28, token-mean (DAPO) loss, no KL/reference model, one optimizer step per batch,
one forward/backward micro-batch, fp32, and the same torch thread count.

Measured: completions per second of wall time over `--steps` steps after one warm-up step (the warm-up pays
for lazy initialisation on both sides). thermik runs its real step (`thermik.runs.local.setup` + `LocalMode.step`,
weight sync to its engine included); TRL runs `GRPOTrainer.train()`, each step timed from on_step_begin to
on_step_end (generation, reward, forward/backward, optimizer step). By default the two alternate step by step
(`--schedule interleaved`) so that background load on a shared machine hits both alike.

    python benchmarks/grpo_vs_trl.py --preset qwen2-5m --steps 5 --prompts 8 --group 8 --max-tokens 32

Needs the `bench` extra (`pip install -e .[bench]`) for the TRL half.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from thermik.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    ModelConfig,
    MonitorConfig,
    OptimizerConfig,
    RolloutConfig,
    RunConfig,
    SamplingConfig,
    TrainerConfig,
)
from thermik.models.loading import load_model, load_tokenizer
from thermik.models.presets import init_model
from thermik.runs.local import LocalMode, setup
from thermik.tasks.registry import generate_rows
from thermik.tasks.reverse_text.env import reversal_reward

SIDES = ("thermik", "trl")
SCHEDULES = ("interleaved", "sequential")
ENV = "reverse_text"
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
BETAS = (0.9, 0.98)
MAX_PROMPT_TOKENS = 128


@dataclass(frozen=True)
class BenchSpec:
    model_dir: Path
    work_dir: Path
    steps: int
    prompts: int
    group: int
    max_tokens: int
    lr: float
    seed: int
    threads: int

    @property
    def batch(self) -> int:
        return self.prompts * self.group

    @property
    def train_rows(self) -> int:
        return self.prompts * (self.steps + 1)


@dataclass(frozen=True)
class BenchResult:
    side: str
    step_s: list[float]
    completions: int
    mean_length: float
    mean_reward: float

    @property
    def samples_per_s(self) -> float:
        return self.completions / sum(self.step_s)


# ---------------------------------------------------------------- thermik


def thermik_config(spec: BenchSpec) -> RunConfig:
    return RunConfig(
        name="thermik",
        output_dir=str(spec.work_dir),
        seed=spec.seed,
        model=ModelConfig(path=str(spec.model_dir), seed=spec.seed),
        env=EnvConfig(name=ENV, max_turns=1),
        rollout=RolloutConfig(
            max_input_length=MAX_PROMPT_TOKENS,
            max_generate_length=spec.max_tokens,
            max_sequence_length=MAX_PROMPT_TOKENS + spec.max_tokens,
            sampling=SamplingConfig(temperature=1.0),
        ),
        data=DataConfig(synthetic_train_size=spec.train_rows, synthetic_eval_size=1, seed=spec.seed),
        algorithm=AlgorithmConfig(
            advantage={"type": "grpo"},
            loss={"type": "ppo", "clip_low": CLIP_LOW, "clip_high": CLIP_HIGH},
            reduction={"type": "token_mean"},
            kl={"coef": 0.0},
        ),
        trainer=TrainerConfig(
            steps=spec.steps + 1,
            prompts_per_step=spec.prompts,
            group_size=spec.group,
            mini_batches=1,
            micro_batch_size=spec.batch,
            optimizer=OptimizerConfig(lr=spec.lr, betas=BETAS, weight_decay=0.0, warmup_steps=0),
        ),
        checkpoint=CheckpointConfig(resume=False),
        eval=EvalConfig(size=1, before=False),
        monitor=MonitorConfig(progress=False, save_trajectories_every=0),
    )


class ThermikStepper:
    """thermik's real RL step (`setup` + `rl_step`) on one persistent event loop, so steps can interleave with TRL's."""

    def __init__(self, spec: BenchSpec) -> None:
        self.loop = asyncio.new_event_loop()
        self.run = self.loop.run_until_complete(self._setup(thermik_config(spec)))

    @staticmethod
    async def _setup(cfg: RunConfig) -> LocalMode:
        return LocalMode(setup(cfg))

    def step(self, step: int) -> tuple[float, dict[str, float]]:
        t0 = time.perf_counter()
        metrics = self.loop.run_until_complete(self.run.step(step))
        return time.perf_counter() - t0, metrics

    def close(self) -> None:
        self.loop.run_until_complete(self.run.run.close())
        self.loop.close()


@dataclass
class StepLog:
    """Per-step wall time, mean completion length and mean reward of one side; step 0 is the warm-up."""

    side: str
    seconds: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    def add(self, seconds: float, length: float, reward: float) -> None:
        self.seconds.append(seconds)
        self.lengths.append(length)
        self.rewards.append(reward)

    def result(self, spec: BenchSpec) -> BenchResult:
        if len(self.seconds) != spec.steps + 1:
            raise RuntimeError(f"{self.side} ran {len(self.seconds)} steps, expected {spec.steps + 1}")
        return BenchResult(
            self.side,
            self.seconds[1:],
            spec.batch * spec.steps,
            statistics.fmean(self.lengths[1:]),
            statistics.fmean(self.rewards[1:]),
        )


def thermik_step_into(stepper: ThermikStepper, log: StepLog, step: int) -> None:
    seconds, metrics = stepper.step(step)
    log.add(seconds, metrics["response_length/mean"], metrics["reward/mean"])


def run_thermik(spec: BenchSpec) -> BenchResult:
    torch.set_num_threads(spec.threads)
    stepper, log = ThermikStepper(spec), StepLog("thermik")
    try:
        for step in range(spec.steps + 1):
            thermik_step_into(stepper, log, step)
    finally:
        stepper.close()
    return log.result(spec)


# ---------------------------------------------------------------- TRL


def reverse_text_reward(completions: list[list[dict[str, str]]], ground_truth: list[str], **_: Any) -> list[float]:
    """TRL reward function: thermik's reverse_text reward on each (conversational) completion."""
    return [reversal_reward(c[0]["content"], gt) for c, gt in zip(completions, ground_truth, strict=True)]


def trl_config(spec: BenchSpec) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(spec.work_dir / "trl"),
        use_cpu=True,
        seed=spec.seed,
        max_steps=spec.steps + 1,
        per_device_train_batch_size=spec.batch,
        gradient_accumulation_steps=1,
        num_generations=spec.group,
        num_iterations=1,
        max_completion_length=spec.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        weight_decay=0.0,
        max_grad_norm=1.0,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,  # TRL's base config turns it on (via the deprecated alias) by default
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )


def run_trl(spec: BenchSpec, after_step: Callable[[int], None] | None = None) -> BenchResult:
    """TRL's GRPOTrainer.train(); each step timed from on_step_begin to on_step_end, then `after_step(step)` runs."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    log = StepLog("trl")

    class StepClock(TrainerCallback):
        """Times each optimizer step and copies its metrics before TRL's end-of-training log clears them."""

        trainer: Any = None
        t0 = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seconds = time.perf_counter() - self.t0
            metrics = self.trainer._metrics["train"]
            log.add(seconds, metrics["completions/mean_length"][-1], metrics["reward"][-1])
            if after_step is not None:
                after_step(len(log.seconds) - 1)

    torch.set_num_threads(spec.threads)
    rows = generate_rows(ENV, spec.train_rows, spec.seed, split="train")
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_spec"]["ground_truth"]} for r in rows]
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=load_model(spec.model_dir),
        reward_funcs=reverse_text_reward,
        args=trl_config(spec),
        train_dataset=dataset,
        processing_class=load_tokenizer(spec.model_dir),
        callbacks=[clock],
    )
    clock.trainer = trainer
    trainer.remove_callback(PrinterCallback)  # it would print the end-of-training summary dict
    trainer.train()
    if torch.get_num_threads() != spec.threads:
        raise RuntimeError(f"TRL changed torch threads to {torch.get_num_threads()} (asked {spec.threads})")
    return log.result(spec)


def run_interleaved(spec: BenchSpec) -> list[BenchResult]:
    """TRL step k, then thermik step k, and so on: both sides see the same background load on a shared machine."""
    torch.set_num_threads(spec.threads)
    stepper, log = ThermikStepper(spec), StepLog("thermik")
    try:
        trl = run_trl(spec, after_step=lambda step: thermik_step_into(stepper, log, step))
    finally:
        stepper.close()
    return [log.result(spec), trl]


RUNNERS = {"thermik": run_thermik, "trl": run_trl}


# ---------------------------------------------------------------- report


def format_table(results: list[BenchResult], spec: BenchSpec) -> str:
    head = f"{'side':<8} {'samples/s':>10} {'s/step':>8} {'min s':>7} {'max s':>7} {'mean len':>9} {'reward':>7}"
    lines = [
        f"{spec.steps} measured steps x {spec.batch} completions ({spec.prompts} prompts x {spec.group}), "
        f"max {spec.max_tokens} tokens, {spec.threads} torch threads",
        head,
        "-" * len(head),
    ]
    for r in results:
        lines.append(
            f"{r.side:<8} {r.samples_per_s:>10.1f} {statistics.fmean(r.step_s):>8.3f} {min(r.step_s):>7.3f} "
            f"{max(r.step_s):>7.3f} {r.mean_length:>9.1f} {r.mean_reward:>7.3f}"
        )
    by_side = {r.side: r for r in results}
    if set(SIDES) <= by_side.keys():
        ratio = by_side["thermik"].samples_per_s / by_side["trl"].samples_per_s
        lines.append(f"ratio thermik/trl samples/s: {ratio:.2f}x")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen2-5m", help="thermik model preset (default qwen2-5m)")
    p.add_argument("--steps", type=int, default=5, help="measured steps after one warm-up step")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (>= 2)")
    p.add_argument("--max-tokens", type=int, default=32, help="max completion tokens")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (both sides)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="which halves to run, in order")
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="interleaved",
        help="interleaved: alternate one TRL step and one thermik step (fair under fluctuating background load); "
        "sequential: run each side's steps in turn",
    )
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "max_tokens", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group < 2:
        p.error(f"--group must be >= 2 (GRPO needs a group to compare), got {args.group}")
    return args


def main(argv: list[str] | None = None) -> list[BenchResult]:
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="thermik-bench-") as tmp:
        model_dir = init_model(args.preset, Path(tmp) / "model", seed=args.seed)
        spec = BenchSpec(
            model_dir=model_dir,
            work_dir=Path(tmp),
            steps=args.steps,
            prompts=args.prompts,
            group=args.group,
            max_tokens=args.max_tokens,
            lr=args.lr,
            seed=args.seed,
            threads=args.threads,
        )
        if args.schedule == "interleaved" and set(args.sides) == set(SIDES):
            results = run_interleaved(spec)
        else:
            results = []
            for side in dict.fromkeys(args.sides):
                results.append(RUNNERS[side](spec))
                gc.collect()
    print(f"preset {args.preset}, reverse_text, GRPO, lr {args.lr}, seed {args.seed}, schedule {args.schedule}")
    print(format_table(results, spec))
    return results


if __name__ == "__main__":
    main()
