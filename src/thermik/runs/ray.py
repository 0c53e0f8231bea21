"""`thermik rl` with `distributed.enabled`: the RL step of runs/step.py with its two heavy halves on Ray.

Rollouts go to the engine actors (an `EnginePool`: restart and resubmit on failure); the update is the learner step
of every run mode (`train_on_batch`: advantages, critic, reference and KL, the policy update, the KL controller),
run by each data-parallel trainer worker on the whole batch, each training its shard (distributed/trainer_worker.py).
Weights go from trainer to engines by broadcast or files (`distributed.weight_sync`), then the consistency guards
check them (assembly/guards.py). When asynchronous (a staleness bound above 0) a `GroupProducer` keeps the engines
generating while the workers train (bounded staleness), as in local mode. Sampling (with DAPO dynamic sampling),
held-out evaluation, metrics, plots, checkpoints (written by rank 0) and resume are the single-process run's own.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from thermik.assembly import components
from thermik.assembly.guards import ConsistencyGuards
from thermik.assembly.hardware import check_hardware
from thermik.config.schema import RunConfig
from thermik.distributed.launch import DistributedRun, start
from thermik.rollout.context import RolloutContext, evaluate_held_out
from thermik.rollout.evaluation import EvalResult
from thermik.rollout.group_producer import GroupProducer
from thermik.rollout.staleness import is_asynchronous
from thermik.runs.build import Run, build_run, resume_logger
from thermik.runs.loop import Mode, rl_plan, run_loop
from thermik.runs.resume import check_resume
from thermik.runs.step import Rollout, produced_rollout, rl_step, sample_rollout, start_producer, with_train_speed


class RayMode(Mode):
    """The StepHalves and loop hooks of a run whose engines and trainer workers are Ray actors."""

    def __init__(self, run: Run, dist: DistributedRun) -> None:
        assert run.rollout is not None
        self.run, self.cfg, self.dist = run, run.cfg, dist
        self.rollout_ctx: RolloutContext = run.rollout
        self.producer: GroupProducer | None = None  # asynchronous mode only
        self.guards = ConsistencyGuards.for_run(self.cfg.guards, run.chat)

    async def rollout(self, step: int) -> Rollout:
        """On the engine actors: sync, all episodes of the batch now; async, what the producer made meanwhile."""
        if self.producer is None:
            return await sample_rollout(self.rollout_ctx, step)
        return await produced_rollout(self.rollout_ctx, self.producer, step)

    async def update(self, rollout: Rollout, step: int) -> dict[str, float]:
        """The learner step on the trainer workers (advantages there, on the whole batch)."""
        t0 = time.perf_counter()
        assert rollout.batch is not None  # rl_step updates only a rollout with a batch
        metrics = await self.dist.update(rollout.batch, step, asynchronous=self.producer is not None)
        return with_train_speed(metrics, rollout.batch, time.perf_counter() - t0)

    async def sync_weights(self, step: int) -> dict[str, float]:
        version, seconds = await self.dist.sync_weights()  # trainer -> engines
        metrics = {"weights/version": float(version), "time/weight_sync": seconds}
        metrics |= await self.guards.after_sync(self.dist.engines, self.dist.weight_mismatches, self.dist.score, step)
        if self.producer is not None:
            await self.producer.weights_updated()
        return metrics

    async def start(self) -> None:
        if self.run.start_step:  # the engines start from the base weights; the checkpoint's are version start_step
            await self.dist.sync_weights(version=self.run.start_step)
        if is_asynchronous(self.cfg):
            self.producer = start_producer(self.rollout_ctx)

    async def step(self, step: int) -> dict[str, float]:
        return await rl_step(self, step)

    async def evaluate(self, label: str) -> EvalResult:
        return await evaluate_held_out(self.rollout_ctx, label, self.cfg.run_dir)

    def save(self, step: int) -> None:
        self.dist.trainer.save_checkpoint(step, {"step": step, "sampler": self.rollout_ctx.sampler.state_dict()})

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()

    def export(self) -> Path:
        """The trained policy in HF format (with tokenizer and chat template; with LoRA merged, plus its adapter) at
        <run_dir>/export."""
        policy, _ = components.load_policy(self.cfg.model, self.cfg.lora, self.cfg.env.tool_parser)
        policy.load_state_dict(self.dist.trainer.state_dict())
        out = self.cfg.run_dir / "export"
        components.export_policy(policy, self.run.chat, out)
        return out


def setup(cfg: RunConfig, dist: DistributedRun) -> RayMode:
    """The driver's side: tokenizer, rollout half on the engine actors; the policy lives on the trainer workers."""
    run = build_run(cfg, load_policy=False, engine=lambda _policy, _chat: dist.engines, learner=False)
    latest = dist.trainer.checkpoints.latest() if cfg.checkpoint.resume else None
    if latest is not None:
        extra = dist.trainer.load_checkpoint(latest)
        resume_logger(run, int(extra["step"]), extra["sampler"])
    return RayMode(run, dist)


async def train(cfg: RunConfig) -> dict[str, Any]:
    check_resume(cfg)  # a refused resume (another config) before Ray starts
    if not cfg.distributed.ray_address:  # a local Ray: the actors run on this machine (a cluster's are not asked)
        check_hardware(cfg.model, cfg.inference)
    dist = start(cfg)
    mode = None
    try:
        mode = setup(cfg, dist)
        return await run_loop(mode, mode.run, rl_plan(cfg, f"GRPO on Ray {cfg.env.name}"))
    finally:
        if mode is not None:
            await mode.stop()
            await mode.run.close(engine=False)  # the engine actors go with the Ray side
        dist.shutdown()


def run_rl(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train(cfg))
