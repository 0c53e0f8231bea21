"""`thermik rl` on one process: the engine, the environments and the learner share this process.

Synchronous by default; when asynchronous (a staleness bound above 0: rollout/staleness.py) a `GroupProducer` keeps
generating groups while the trainer trains, and the update takes the rollout logprobs as the behaviour policy.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import torch

from thermik.assembly import components
from thermik.assembly.guards import ConsistencyGuards, local_weight_check, policy_scorer
from thermik.config.schema import InferenceConfig, RunConfig
from thermik.memory import release_freed_memory
from thermik.rollout.context import RolloutContext, evaluate_held_out
from thermik.rollout.group_producer import GroupProducer
from thermik.rollout.staleness import is_asynchronous
from thermik.runs.build import Run, build_run
from thermik.runs.loop import Mode, rl_plan, run_loop
from thermik.runs.record import Recorder
from thermik.runs.step import Rollout, learner_update, produced_rollout, rl_step, sample_rollout, start_producer
from thermik.training.learner import Learner
from thermik.training.run_checkpoint import save_checkpoint

__all__ = ["LocalMode", "run_rl", "setup"]


class LocalMode(Mode):
    """The StepHalves and loop hooks of a single-process run."""

    def __init__(self, run: Run) -> None:
        assert run.rollout is not None and run.learner is not None
        self.run, self.cfg = run, run.cfg
        self.rollout_ctx: RolloutContext = run.rollout
        self.learner: Learner = run.learner
        self.producer: GroupProducer | None = None  # asynchronous mode only
        self.guards = ConsistencyGuards.for_run(self.cfg.guards, run.chat)
        self.recorder = Recorder(self.cfg.run_dir) if self.cfg.record else None

    # ---------------------------------------------------------------- StepHalves

    async def rollout(self, step: int) -> Rollout:
        """Sync: all episodes of the batch now (+ DAPO dynamic sampling); async: the oldest admissible groups the
        producer made meanwhile."""
        if self.producer is None:
            return await sample_rollout(self.rollout_ctx, step)
        return await produced_rollout(self.rollout_ctx, self.producer, step)

    async def update(self, rollout: Rollout, step: int) -> dict[str, float]:
        before = self.recorder.before_update(rollout) if self.recorder is not None else None
        metrics = await learner_update(self.learner, rollout, step, asynchronous=self.producer is not None)
        if self.recorder is not None and before is not None:
            self.recorder.after_update(before, self.learner.policy, step)
        return metrics

    async def sync_weights(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        sent = components.engine_weights(self.learner.policy)
        version = await self.rollout_ctx.engine.update_weights(sent)
        metrics = {"weights/version": float(version), "time/weight_sync": time.perf_counter() - t0}
        engine, score = self.rollout_ctx.engine, policy_scorer(self.learner.policy)
        metrics |= await self.guards.after_sync(engine, local_weight_check(engine, sent), score, step)
        if self.producer is not None:
            await self.producer.weights_updated()
        return metrics

    # ---------------------------------------------------------------- loop hooks

    async def start(self) -> None:
        if self.run.start_step:  # the checkpoint's weights, as the version an uninterrupted run's engine holds now
            weights = components.engine_weights(self.learner.policy)
            await self.rollout_ctx.engine.update_weights(weights, version=self.run.start_step)
        if is_asynchronous(self.cfg):
            self.producer = start_producer(self.rollout_ctx)

    async def step(self, step: int) -> dict[str, float]:
        return await rl_step(self, step)

    async def evaluate(self, label: str) -> Any:
        return await evaluate_held_out(self.rollout_ctx, label, self.cfg.run_dir)

    def save(self, step: int) -> None:
        save_checkpoint(self.learner, step, {"sampler": self.rollout_ctx.sampler.state_dict()})

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()

    def export(self) -> Path:
        out = self.cfg.run_dir / "export"
        components.export_policy(self.learner.policy, self.run.chat, out)
        return out


def thread_split(cfg: RunConfig) -> tuple[InferenceConfig, int]:
    """(inference config, update threads). Asynchronous training decodes and updates at the same time in two
    threads of this process; each running OpenMP teams of all cores makes them spin against each other, so unless
    inference.num_threads is set, each gets half of torch's threads (measured: README, async benchmark)."""
    if not is_asynchronous(cfg) or cfg.inference.num_threads:
        return cfg.inference, 0
    half = max(1, torch.get_num_threads() // 2)
    return cfg.inference.model_copy(update={"num_threads": half}), max(1, torch.get_num_threads() - half)


def setup(cfg: RunConfig) -> Run:
    """The run of `thermik rl` on one process (policy, learner, engine, rollout half), resumed when asked."""
    engine_cfg, update_threads = thread_split(cfg)
    run = build_run(
        cfg,
        engine=lambda policy, chat: components.build_engine(policy, chat, engine_cfg),
        update_threads=update_threads,
    )
    return run


async def train(cfg: RunConfig) -> dict[str, Any]:
    run = setup(cfg)
    mode = LocalMode(run)
    try:
        return await run_loop(mode, run, rl_plan(cfg, f"GRPO {cfg.env.name}"))
    finally:
        await mode.stop()
        await run.close()
        release_freed_memory()


def run_rl(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train(cfg))
