"""The core of one RL step, the same in every run mode: rollout -> rewards -> advantages -> update -> weight sync.

The modes differ only in where each half runs and how weights travel, which a `StepHalves` implementation says:

| mode | rollout | update | weight sync |
|---|---|---|---|
| local (runs/local.py) | this process's engine (or the async producer) | this process's learner | into the engine |
| Ray (runs/ray.py) | engine actors (or the async producer) | each trainer actor's learner | broadcast or files |
| split trainer | read the orchestrator's batch | this process's learner | publish weights (shm or file) |
| split orchestrator | admission + the server (or the async producer) | publish the batch | loaded as published |
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from thermik.inference.base import InProcessKVCache
from thermik.rollout.context import RolloutContext, dump_step_trajectories, play_rows, sample_groups, scored
from thermik.rollout.group_producer import GroupProducer
from thermik.rollout.metrics import rollout_metrics
from thermik.rollout.staleness import max_staleness
from thermik.rollout.trajectory import Trajectory
from thermik.training.batch import TokenBatch, collate
from thermik.training.learner import Learner, train_on_batch


@dataclass
class Rollout:
    """One step's rollout: every sampled trajectory, the training batch made from them, and their metrics."""

    sampled: list[Trajectory]  # all episodes sampled this step (dynamic sampling may train on fewer)
    trajs: list[Trajectory]  # the episodes of the training batch (none when the batch was read from files)
    batch: TokenBatch | None  # collated training batch (exactly the sampled token ids); None: nothing was played
    metrics: dict[str, float] = field(default_factory=dict)


class StepHalves(Protocol):
    async def rollout(self, step: int) -> Rollout: ...

    async def update(self, rollout: Rollout, step: int) -> dict[str, float]: ...

    async def sync_weights(self, step: int) -> dict[str, float]: ...


async def rl_step(halves: StepHalves, step: int) -> dict[str, float]:
    """One RL step (0-based `step`); returns its metrics. Each half reports its own timings."""
    t_step = time.perf_counter()
    # 1. Rollout: n samples per prompt, rewards from the environments.
    rollout = await halves.rollout(step)
    # 2.+3. Rewards -> advantages -> policy (and critic) update on exactly the sampled token ids (none: every prompt
    # of the step was skipped, which the run's verdict counts).
    update_metrics = await halves.update(rollout, step) if rollout.batch is not None else {}
    update_metrics["batch/trained_tokens"] = trained_tokens(rollout.batch)
    # 4. Weight sync: the new weights reach the engine (version + 1).
    sync_metrics = await halves.sync_weights(step)
    # 5. Log: everything this step measured.
    return {**rollout.metrics, **update_metrics, **sync_metrics, "time/step": time.perf_counter() - t_step}


def trained_tokens(batch: TokenBatch | None) -> float:
    """Tokens of the batch that carry loss (0: a degenerate batch, e.g. every episode overlong)."""
    return 0.0 if batch is None else float(batch.mask.sum())


def tokens_per_s(tokens: float, seconds: float) -> float:
    return tokens / max(seconds, 1e-9)


def make_rollout(
    ctx: RolloutContext, step: int, sampled: list[Trajectory], trajs: list[Trajectory], metrics: dict[str, float]
) -> Rollout:
    """The Rollout of episodes sampled in this process in `metrics["time/generate"]` seconds: dumps them when due,
    collates the training batch `trajs` (the scored groups of `sampled`, or those dynamic sampling kept; none left:
    an empty batch, whose update is skipped), and has the model rewards judge the step."""
    if not sampled:  # every prompt of the step was skipped (too long): nothing played, nothing to train on
        return Rollout(sampled, trajs, None, metrics)
    dump_step_trajectories(ctx, step, sampled)
    if ctx.rewards is not None:
        ctx.rewards.after_step(step, metrics)
    batch = collate(trajs, None, ctx.chat.tokenizer.pad_token_id or 0)
    tokens = sum(t.num_generated_tokens for t in sampled)
    metrics = {**rollout_metrics(sampled), **metrics}
    metrics["episodes/overlong"] = float(sum(any(s.env_metrics.get("overlong") for s in t.samples) for t in sampled))
    metrics["episodes/played"] = float(len(sampled))
    metrics["perf/tokens_per_s"] = tokens_per_s(tokens, metrics["time/generate"])
    return Rollout(sampled, trajs, batch, metrics)


async def sample_rollout(ctx: RolloutContext, step: int) -> Rollout:
    """All episodes of the step sampled now, concurrently, on ctx.engine (+ DAPO dynamic sampling). Besides its wall
    time, `time/generate_cpu`: this process's CPU seconds meanwhile, all threads (tool servers in other processes
    not counted); with `time/train_cpu` they say how much of a step the cores are busy (benchmarks/async_vs_sync.py)."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    sampled, trajs, metrics = await sample_groups(ctx, step)
    if isinstance(ctx.engine, InProcessKVCache):  # its cached prefixes go stale at the update: free them for training
        ctx.engine.release_idle_cache()
    seconds = {"time/generate": time.perf_counter() - t0, "time/generate_cpu": time.process_time() - cpu0}
    return make_rollout(ctx, step, sampled, trajs, {**metrics, **seconds})


async def produced_rollout(
    ctx: RolloutContext, producer: GroupProducer, step: int, trainer_version: int | None = None
) -> Rollout:
    """Asynchronous training: the oldest admissible groups the producer made meanwhile, as this step's Rollout
    (`trainer_version`: the weights that train it, when the engine's are not: GroupProducer.next_batch)."""
    t0 = time.perf_counter()
    groups, metrics = await producer.next_batch(trainer_version)
    if ctx.rewards is not None:
        metrics |= ctx.rewards.take_unlogged()
    for group_id, group in enumerate(groups):
        for traj in group.trajectories:
            traj.group_id = group_id
    trajs = [t for g in groups for t in g.trajectories]
    return make_rollout(ctx, step, trajs, scored(trajs), {**metrics, "time/generate": time.perf_counter() - t0})


def start_producer(ctx: RolloutContext, first_version: int | None = None) -> GroupProducer:
    """A GroupProducer that keeps generating groups on ctx.engine while the trainer trains (bounded staleness:
    `max_staleness`), in every mode whose engine is an InferenceEngine here (local, Ray, the split orchestrator's
    RemoteEngine); `first_version`: the weights that train its first batch (default: the engine's now)."""
    cfg = ctx.cfg

    async def rollout_group(row: dict[str, Any], index: int) -> list[Trajectory]:
        seed = cfg.seed * 1_000_003 + index * 10_007
        trajs, metrics = await play_rows(ctx, [row], seed)
        if ctx.rewards is not None:
            ctx.rewards.unlogged.append(metrics)  # logged by the step that trains these groups
        return trajs

    producer = GroupProducer(
        rollout_group,
        ctx.sampler,
        cfg.trainer.prompts_per_step,
        max_staleness(cfg),
        lambda: ctx.engine.weight_version,
        stale=cfg.trainer.stale_groups,
    )
    producer.start(first_version)
    return producer


def with_train_speed(metrics: dict[str, float], batch: TokenBatch, seconds: float) -> dict[str, float]:
    """The update's metrics with its time and trained tokens per second."""
    train_tokens = float(batch.attention_mask.sum())
    return {**metrics, "time/train": seconds, "perf/train_tokens_per_s": tokens_per_s(train_tokens, seconds)}


async def learner_update(learner: Learner, rollout: Rollout, step: int, *, asynchronous: bool) -> dict[str, float]:
    """Advantages, then the policy (and critic) update in this process, in a thread: async rollouts and tool calls
    go on meanwhile. asynchronous: the rollout logprobs are the behaviour policy (asynchronous training)."""
    assert rollout.batch is not None  # rl_step updates only a rollout with a batch
    cpu0 = time.process_time()
    metrics, t_train = await train_on_batch(learner, rollout.batch, step, asynchronous=asynchronous)
    if not asynchronous:  # alone in the process: its CPU seconds are the update's (time/generate_cpu's twin)
        metrics = {**metrics, "time/train_cpu": time.process_time() - cpu0}
    return with_train_speed(metrics, rollout.batch, t_train)
