"""`thermik rl` with `distributed.enabled`: the RL step of runs/step.py with its two heavy halves on Ray.

Rollouts go to the engine actors (an `EnginePool`: restart and resubmit on failure), the update to the
data-parallel trainer workers (`DistributedRun.update`), weights from trainer to engines by broadcast or files
(`distributed.weight_sync`); sampling (with DAPO dynamic sampling), reward shaping and advantages, held-out
evaluation, metrics, plots, checkpoints (written by rank 0) and resume are the single-process run's own
functions. Not on this path yet (rejected by the config): a critic (gae), LoRA, asynchronous training, KL as a
reward penalty, and an adaptive KL weight (the workers apply algorithm.kl_coef as a loss term).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from thermik.assembly import components
from thermik.config.schema import RunConfig
from thermik.distributed.launch import DistributedRun, start
from thermik.rollout.context import RolloutContext, evaluate_held_out
from thermik.rollout.evaluation import EvalResult
from thermik.runs.build import Run, build_run, resume_logger
from thermik.runs.loop import Mode, rl_plan, run_loop
from thermik.runs.step import Rollout, rl_step, sample_rollout
from thermik.training.algo_state import AlgorithmState
from thermik.training.shaping import assign_advantages


class RayMode(Mode):
    """The StepHalves and loop hooks of a run whose engines and trainer workers are Ray actors."""

    def __init__(self, run: Run, dist: DistributedRun) -> None:
        assert run.rollout is not None
        self.run, self.cfg, self.dist = run, run.cfg, dist
        self.rollout_ctx: RolloutContext = run.rollout
        self.algo = AlgorithmState.from_config(self.cfg.algorithm)

    async def rollout(self, step: int) -> Rollout:
        return await sample_rollout(self.rollout_ctx, step)  # on the engine actors

    async def update(self, rollout: Rollout, step: int) -> dict[str, float]:
        """Shaped rewards -> advantages here, then the data-parallel update on the trainer workers."""
        cfg, alg = self.cfg, self.cfg.algorithm
        adv_metrics = assign_advantages(rollout.batch, alg, max_response_length=cfg.rollout.max_generate_length)
        t0 = time.perf_counter()
        temperature = cfg.rollout.sampling.temperature or 1.0
        update_metrics = await self.dist.update(rollout.batch, alg, cfg.trainer, temperature)
        state_metrics = self.algo.after_update({**adv_metrics, **update_metrics}, len(rollout.batch))
        return {**adv_metrics, **update_metrics, **state_metrics, "time/train": time.perf_counter() - t0}

    async def sync_weights(self, step: int) -> dict[str, float]:
        version, seconds = await self.dist.sync_weights()  # trainer -> engines
        return {"weights/version": float(version), "time/weight_sync": seconds}

    async def start(self) -> None:
        if self.run.start_step:
            await self.dist.sync_weights()  # the engines start from the base weights

    async def step(self, step: int) -> dict[str, float]:
        return await rl_step(self, step)

    async def evaluate(self, label: str) -> EvalResult:
        return await evaluate_held_out(self.rollout_ctx, label, self.cfg.run_dir)

    def save(self, step: int) -> None:
        self.dist.trainer.save_checkpoint(step, {"step": step, "sampler": self.rollout_ctx.sampler.state_dict()})

    def export(self) -> Path:
        """The trained policy in HF format (with tokenizer and chat template) at <run_dir>/export."""
        policy, _ = components.load_policy(self.cfg.model)
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
        print(f"resumed {cfg.run_dir} from {latest.name} (step {run.start_step} of {cfg.trainer.steps})")
    return RayMode(run, dist)


async def train(cfg: RunConfig) -> dict[str, Any]:
    dist = start(cfg)
    mode = None
    try:
        mode = setup(cfg, dist)
        return await run_loop(mode, mode.run, rl_plan(cfg, f"GRPO on Ray {cfg.env.name}"))
    finally:
        if mode is not None:
            await mode.run.close(engine=False)  # the engine actors go with the Ray side
        dist.shutdown()


def run_rl(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train(cfg))
