"""GRPO: rollout -> rewards -> advantages -> update -> weight sync -> log, one step at a time.

Synchronous by default; with trainer.max_off_policy_steps > 0 a `GroupProducer` keeps generating groups while
the trainer trains (bounded staleness), and the update takes the rollout logprobs as the behaviour policy.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from thermik.config.loader import dump_toml
from thermik.config.schema import InferenceConfig, RunConfig
from thermik.data.sampler import PromptSampler
from thermik.rollout.agent_loop import LoopLimits, rollout_rows
from thermik.rollout.metrics import rollout_metrics
from thermik.rollout.trajectory import Trajectory, dump_trajectories
from thermik.tools.mcp_pool import MCPPool
from thermik.training import components
from thermik.training.batch import collate
from thermik.training.group_producer import GroupProducer
from thermik.training.learner import CRITIC_DIR, Learner, learner_parts, restore, save_checkpoint, train_on_batch
from thermik.training.loop import run_loop
from thermik.training.rollout_context import RolloutContext, evaluate_held_out, sample_step

__all__ = ["CRITIC_DIR", "RLRun", "rl_step", "run_rl", "setup", "train"]


@dataclass(kw_only=True)
class RLRun(Learner, RolloutContext):
    """Everything one RL run holds (the training and the rollout half); built once by `setup`, read by `rl_step`."""

    producer: GroupProducer | None = None  # asynchronous mode only


def setup(cfg: RunConfig, pool: MCPPool) -> RLRun:
    components.seed_everything(cfg.seed)
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(cfg))
    policy, chat = components.load_policy(cfg.model, cfg.lora)
    train_rows, held_out = components.load_datasets(cfg.data, cfg.env.name)
    engine_cfg, update_threads = _thread_split(cfg)
    learner = learner_parts(cfg, policy, run_dir)
    run = RLRun(
        cfg=cfg,
        policy=policy,
        chat=chat,
        engine=components.build_engine(policy, chat, engine_cfg),
        make_env=components.env_factory(cfg.env, pool),
        sampler=PromptSampler(train_rows, cfg.data.seed),
        held_out=held_out[: cfg.eval.size],
        limits=LoopLimits.from_config(cfg.rollout, cfg.env.max_turns),
        update_threads=update_threads,
        **learner,
    )
    extra = restore(run)
    if extra is not None:
        run.sampler.load_state_dict(extra["sampler"])
        print(f"resumed {cfg.run_dir} from step_{run.start_step} (step {run.start_step} of {cfg.trainer.steps})")
    return run


async def rl_step(run: RLRun, step: int) -> dict[str, float]:
    cfg = run.cfg
    t_step = time.perf_counter()
    # 1. Rollout: n samples per prompt (sync: all episodes of the batch now, concurrently, + DAPO dynamic
    #    sampling; async: the oldest admissible groups the producer made meanwhile).
    t0 = time.perf_counter()
    sampled, trajs, batch_metrics = await (sample_step(run, step) if run.producer is None else _take_groups(run))
    t_generate = time.perf_counter() - t0
    # 2.+3. Rewards -> advantages -> policy (and critic) update on exactly the sampled token ids, in a thread:
    #    async rollouts and tool calls go on meanwhile (learner.train_on_batch, shared with `thermik trainer`).
    batch = collate(trajs, None, run.chat.tokenizer.pad_token_id or 0)
    train_metrics, t_train = await train_on_batch(run, batch, step, rollout_is_behaviour=run.producer is not None)
    # 4. Weight sync: trainer weights -> engine, version + 1.
    t0 = time.perf_counter()
    version = await run.engine.update_weights(components.engine_weights(run.policy))
    if run.producer is not None:
        await run.producer.weights_updated()
    t_sync = time.perf_counter() - t0
    # 5. Log.
    sampled_tokens = sum(t.num_generated_tokens for t in sampled)
    step_s = time.perf_counter() - t_step
    metrics = {
        **rollout_metrics(sampled),
        **batch_metrics,
        **train_metrics,
        "weights/version": float(version),
        "time/generate": t_generate,
        "time/train": t_train,
        "time/weight_sync": t_sync,
        "time/step": step_s,
        "perf/tokens_per_s": sampled_tokens / max(t_generate, 1e-9),
        "perf/train_tokens_per_s": float(batch.attention_mask.sum()) / max(t_train, 1e-9),
    }
    dump_every = cfg.monitor.save_trajectories_every
    if dump_every and (step + 1) % dump_every == 0:
        dump_trajectories(cfg.run_dir / "trajectories" / f"step_{step + 1}.jsonl", sampled)
    return metrics


def _thread_split(cfg: RunConfig) -> tuple[InferenceConfig, int]:
    """(inference config, update threads). Asynchronous training decodes and updates at the same time in two
    threads of this process; each running OpenMP teams of all cores makes them spin against each other, so unless
    inference.num_threads is set, each gets half of torch's threads (measured: README, async benchmark)."""
    if cfg.trainer.max_off_policy_steps == 0 or cfg.inference.num_threads:
        return cfg.inference, 0
    half = max(1, torch.get_num_threads() // 2)
    return cfg.inference.model_copy(update={"num_threads": half}), max(1, torch.get_num_threads() - half)


async def _take_groups(run: RLRun) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
    groups, metrics = await run.producer.next_batch()
    for group_id, group in enumerate(groups):
        for traj in group.trajectories:
            traj.group_id = group_id
    trajs = [t for g in groups for t in g.trajectories]
    return trajs, trajs, metrics


def _start_producer(run: RLRun) -> GroupProducer:
    cfg = run.cfg

    async def rollout_group(row: dict[str, Any], index: int) -> list[Trajectory]:
        seed = cfg.seed * 1_000_003 + index * 10_007
        return await rollout_rows(
            run.engine, run.make_env, run.chat, [row], cfg.trainer.group_size, run.limits, cfg.rollout.sampling, seed
        )

    producer = GroupProducer(
        rollout_group,
        run.sampler,
        cfg.trainer.prompts_per_step,
        cfg.trainer.max_off_policy_steps,
        lambda: run.engine.weight_version,
        stale=cfg.trainer.stale_groups,
    )
    producer.start()
    return producer


def _save_checkpoint(run: RLRun, step: int) -> None:
    save_checkpoint(run, step, {"sampler": run.sampler.state_dict()})


def _export(run: RLRun) -> Path:
    out = run.cfg.run_dir / "export"
    components.export_policy(run.policy, run.chat, out)
    return out


async def train(cfg: RunConfig) -> dict[str, Any]:
    pool = MCPPool(log_dir=cfg.run_dir / "logs")  # each MCP server's stderr: logs/mcp-<name>.log
    run = setup(cfg, pool)

    async def start() -> None:
        if run.start_step:
            await run.engine.update_weights(components.engine_weights(run.policy))
        if cfg.trainer.max_off_policy_steps > 0:
            run.producer = _start_producer(run)

    async def stop() -> None:
        if run.producer is not None:
            await run.producer.stop()

    try:
        return await run_loop(
            run,
            lambda step: rl_step(run, step),
            lambda label: evaluate_held_out(run, label, cfg.run_dir),
            lambda step: _save_checkpoint(run, step),
            lambda: _export(run),
            f"GRPO {cfg.env.name}",
            start,
            stop,
        )
    finally:
        await stop()
        run.logger.close()
        await run.engine.close()
        await pool.aclose()


def run_rl(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train(cfg))
