"""`thermik rl` with `distributed.enabled`: the GRPO loop of training/rl.py with its two heavy halves on Ray.

Rollouts go to the engine actors (an `EnginePool`: restart and resubmit on failure), the update to the
data-parallel trainer workers (`DistributedRun.update`), weights from trainer to engines by broadcast or files
(`distributed.weight_sync`); sampling (with DAPO dynamic sampling), reward shaping and advantages, held-out
evaluation, metrics, plots, checkpoints (written by rank 0) and resume are the single-process loop's own
functions. Not on this path yet (rejected by the config): a critic (gae), LoRA, asynchronous training, KL as a
reward penalty, and an adaptive KL weight (the workers apply algorithm.kl_coef as a loss term).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thermik.config.loader import dump_toml
from thermik.config.schema import RunConfig
from thermik.data.sampler import PromptSampler
from thermik.distributed.launch import DistributedRun, start
from thermik.models.loading import load_tokenizer
from thermik.monitor.metrics import MetricsLogger
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.metrics import rollout_metrics
from thermik.rollout.tokenization import ChatTokenizer
from thermik.tools.mcp_pool import MCPPool
from thermik.training import components
from thermik.training.algo_state import AlgorithmState
from thermik.training.batch import collate
from thermik.training.loop import run_loop
from thermik.training.rollout_context import RolloutContext, evaluate_held_out, sample_step
from thermik.training.shaping import assign_advantages


@dataclass(kw_only=True)
class RayRLRun(RolloutContext):
    """The rollout half of a run, its engine the pool of engine actors; plus the Ray side and the driver's state."""

    dist: DistributedRun
    logger: MetricsLogger
    algo: AlgorithmState
    start_step: int = 0


def setup(cfg: RunConfig, dist: DistributedRun, pool: MCPPool) -> RayRLRun:
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "config.toml").write_text(dump_toml(cfg))
    train_rows, held_out = components.load_datasets(cfg.data, cfg.env.name)
    chat = ChatTokenizer(load_tokenizer(cfg.model.path, cfg.model.chat_template), cfg.env.tool_parser)  # no policy here
    run = RayRLRun(
        cfg=cfg,
        dist=dist,
        engine=dist.engines,
        chat=chat,
        make_env=components.env_factory(cfg.env, pool),
        sampler=PromptSampler(train_rows, cfg.data.seed),
        held_out=held_out[: cfg.eval.size],
        limits=LoopLimits.from_config(cfg.rollout, cfg.env.max_turns),
        logger=MetricsLogger(cfg.run_dir, tensorboard=cfg.monitor.tensorboard, wandb_project=cfg.monitor.wandb_project),
        algo=AlgorithmState.from_config(cfg.algorithm),
    )
    latest = dist.trainer.checkpoints.latest() if cfg.checkpoint.resume else None
    if latest is not None:
        extra = dist.trainer.load_checkpoint(latest)
        run.start_step = int(extra["step"])
        run.sampler.load_state_dict(extra["sampler"])
        run.logger.truncate_after(run.start_step + 1)
        print(f"resumed {cfg.run_dir} from {latest.name} (step {run.start_step} of {cfg.trainer.steps})")
    return run


async def rl_step(run: RayRLRun, step: int) -> dict[str, float]:
    cfg, alg = run.cfg, run.cfg.algorithm
    temperature = cfg.rollout.sampling.temperature or 1.0
    t_step = time.perf_counter()
    sampled, trajs, batch_metrics = await sample_step(run, step)  # 1. rollouts on the engine actors
    t_generate = time.perf_counter() - t_step
    batch = collate(trajs, None, run.chat.tokenizer.pad_token_id or 0)  # 2. shaped rewards -> advantages
    adv_metrics = assign_advantages(batch, alg, max_response_length=cfg.rollout.max_generate_length)
    t0 = time.perf_counter()
    update_metrics = await run.dist.update(batch, alg, cfg.trainer, temperature)  # 3. data-parallel update
    state_metrics = run.algo.after_update({**adv_metrics, **update_metrics}, len(trajs))
    t_train = time.perf_counter() - t0
    version, t_sync = await run.dist.sync_weights()  # 4. trainer -> engines
    return {
        **rollout_metrics(sampled),
        **batch_metrics,
        **adv_metrics,
        **update_metrics,
        **state_metrics,
        "weights/version": float(version),
        "time/generate": t_generate,
        "time/train": t_train,
        "time/weight_sync": t_sync,
        "time/step": time.perf_counter() - t_step,
    }


def _save_checkpoint(run: RayRLRun, step: int) -> None:
    run.dist.trainer.save_checkpoint(step, {"step": step, "sampler": run.sampler.state_dict()})


def _export(run: RayRLRun) -> Path:
    """The trained policy in HF format (with tokenizer and chat template) at <run_dir>/export."""
    policy, _ = components.load_policy(run.cfg.model)
    policy.load_state_dict(run.dist.trainer.state_dict())
    out = run.cfg.run_dir / "export"
    components.export_policy(policy, run.chat, out)
    return out


async def rl_loop(run: RayRLRun) -> dict[str, Any]:
    """Steps start_step..trainer.steps with evaluation before and after, checkpoints, export and plots."""

    async def push_resumed_weights() -> None:
        if run.start_step:
            await run.dist.sync_weights()  # the engines start from the base weights

    return await run_loop(
        run,
        lambda step: rl_step(run, step),
        lambda label: evaluate_held_out(run, label, run.cfg.run_dir),
        lambda step: _save_checkpoint(run, step),
        lambda: _export(run),
        f"GRPO on Ray {run.cfg.env.name}",
        push_resumed_weights,
    )


async def train(cfg: RunConfig) -> dict[str, Any]:
    dist = start(cfg)
    pool = MCPPool(log_dir=cfg.run_dir / "logs")
    run = None
    try:
        run = setup(cfg, dist, pool)
        return await rl_loop(run)
    finally:
        if run is not None:
            run.logger.close()
        dist.shutdown()
        await pool.aclose()


def run_rl(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train(cfg))
