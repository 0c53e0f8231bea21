"""GRPO: rollout -> rewards -> advantages -> update -> weight sync -> log, one step at a time.

Synchronous by default; with trainer.max_off_policy_steps > 0 a `GroupProducer` keeps generating groups while
the trainer trains (bounded staleness), and the update takes the rollout logprobs as the behaviour policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from thermik.algorithms.shaping import select_groups, zero_variance_rows
from thermik.config.loader import dump_toml
from thermik.config.schema import InferenceConfig, RunConfig
from thermik.data.sampler import PromptSampler
from thermik.eval.evaluate import EvalResult, evaluate
from thermik.inference.base import InferenceEngine
from thermik.monitor.metrics import MetricsLogger
from thermik.monitor.plots import plot_run
from thermik.monitor.progress import StepProgress, print_table
from thermik.rollout.agent_loop import EnvFactory, LoopLimits, rollout_rows
from thermik.rollout.metrics import rollout_metrics
from thermik.rollout.tokenization import ChatTokenizer
from thermik.rollout.trajectory import Trajectory, dump_trajectories
from thermik.tools.mcp_pool import close_default_pool, configure_default_pool
from thermik.training import components, reference
from thermik.training.algo_state import AlgorithmState
from thermik.training.batch import TokenBatch, collate
from thermik.training.checkpoint import CheckpointManager, load_training_state, save_training_state
from thermik.training.critic import Critic
from thermik.training.group_producer import GroupProducer
from thermik.training.optim import build_optimizer
from thermik.training.shaping import assign_advantages
from thermik.training.update import logprobs_no_grad, policy_update

CRITIC_DIR = "critic"  # inside a checkpoint directory: critic weights and optimizer


class SamplingRun(Protocol):
    """What sampling and held-out evaluation read from a run: `RLRun`, or the Ray loop's run
    (thermik.distributed.rl), whose engine is a pool of engine actors."""

    cfg: RunConfig
    engine: InferenceEngine
    make_env: EnvFactory
    chat: ChatTokenizer
    sampler: PromptSampler
    held_out: list[dict[str, Any]]
    limits: LoopLimits


@dataclass
class RLRun:
    """Everything one RL run holds; built once by `setup`, read by `rl_step`."""

    cfg: RunConfig
    policy: torch.nn.Module
    ref: torch.nn.Module | None
    chat: ChatTokenizer
    engine: InferenceEngine
    make_env: EnvFactory
    sampler: PromptSampler
    held_out: list[dict[str, Any]]
    limits: LoopLimits
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpoints: CheckpointManager
    logger: MetricsLogger
    algo: AlgorithmState
    critic: Critic | None = None  # advantage "gae" only
    start_step: int = 0
    producer: GroupProducer | None = None  # asynchronous mode only
    update_threads: int = 0  # torch threads of the update thread; 0 inherits (see _thread_split)


def setup(cfg: RunConfig) -> RLRun:
    components.seed_everything(cfg.seed)
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(cfg))
    configure_default_pool(log_dir=run_dir / "logs")  # each MCP server's stderr: logs/mcp-<name>.log
    policy, chat = components.load_policy(cfg.model, cfg.lora)
    ref = reference.build_reference(policy, cfg.algorithm)
    train_rows, held_out = components.load_datasets(cfg.data, cfg.env.name)
    optimizer, scheduler = build_optimizer(policy, cfg.trainer.optimizer)
    run = RLRun(
        cfg=cfg,
        policy=policy,
        ref=ref,
        chat=chat,
        engine=components.build_engine(policy, chat, _thread_split(cfg)[0]),
        make_env=components.env_factory(cfg.env),
        sampler=PromptSampler(train_rows, cfg.data.seed),
        held_out=held_out[: cfg.eval.size],
        limits=LoopLimits.from_config(cfg.rollout, cfg.env.max_turns),
        optimizer=optimizer,
        scheduler=scheduler,
        checkpoints=CheckpointManager(run_dir / "checkpoints", keep=cfg.checkpoint.keep),
        logger=MetricsLogger(run_dir, tensorboard=cfg.monitor.tensorboard, wandb_project=cfg.monitor.wandb_project),
        algo=AlgorithmState.from_config(cfg.algorithm),
        critic=_build_critic(cfg),
    )
    run.update_threads = _thread_split(cfg)[1]
    latest = run.checkpoints.latest() if cfg.checkpoint.resume else None
    if latest is not None:
        extra = load_training_state(latest, policy, optimizer)
        if run.critic is not None:
            run.critic.load(latest / CRITIC_DIR)
        run.start_step = int(extra["step"])
        run.sampler.load_state_dict(extra["sampler"])
        scheduler.load_state_dict(extra["scheduler"])
        run.algo.kl.value = float(extra.get("kl_coef", run.algo.kl.value))  # the adaptive KL weight goes on
        run.logger.truncate_after(run.start_step + 1)  # steps <= start_step are done and kept
        print(f"resumed {cfg.run_dir} from {latest.name} (step {run.start_step} of {cfg.trainer.steps})")
    return run


def _build_critic(cfg: RunConfig) -> Critic | None:
    """A value model when the advantage estimator needs one (gae)."""
    if cfg.algorithm.advantage != "gae":
        return None
    return Critic.from_config(cfg.model, cfg.critic, cfg.trainer.micro_batch_size)


async def sample_step(run: SamplingRun, step: int) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
    """(all sampled trajectories, the training batch, metrics). With DAPO dynamic sampling the batch keeps only
    groups whose rewards differ: `filter` samples up to dynamic_sampling_max_rounds more rounds of prompts to
    fill prompts_per_step groups, `replace` duplicates kept groups instead."""
    cfg, alg = run.cfg, run.cfg.algorithm
    want = cfg.trainer.prompts_per_step
    extra_rounds = alg.dynamic_sampling_max_rounds if alg.dynamic_sampling == "filter" else 0
    sampled: list[Trajectory] = []
    for r in range(1 + extra_rounds):
        rows = run.sampler.next_batch(want)
        seed = cfg.seed * 1_000_003 + step * 10_007 + r * 7_919
        new = await rollout_rows(
            run.engine, run.make_env, run.chat, rows, cfg.trainer.group_size, run.limits, cfg.rollout.sampling, seed
        )
        for t in new:
            t.group_id += r * want  # group ids stay unique across rounds
        sampled += new
        if alg.dynamic_sampling == "none" or _groups_with_signal(sampled) >= want:
            break
    if alg.dynamic_sampling == "none":
        return sampled, sampled, {}
    picks = select_groups(*_rewards_and_groups(sampled), want, alg.dynamic_sampling)
    batch = [dataclasses.replace(sampled[i], group_id=g) for i, g in picks] or sampled[-want * cfg.trainer.group_size :]
    groups = len({g for _, g in picks})
    return sampled, batch, {"batch/groups_kept": float(groups), "batch/rollout_rounds": float(r + 1)}


def _rewards_and_groups(trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([t.reward for t in trajs], dtype=torch.float32), torch.tensor([t.group_id for t in trajs])


def _groups_with_signal(trajs: list[Trajectory]) -> int:
    rewards, group_ids = _rewards_and_groups(trajs)
    return len(set(group_ids[~zero_variance_rows(rewards, group_ids)].tolist()))


async def rl_step(run: RLRun, step: int) -> dict[str, float]:
    cfg, alg = run.cfg, run.cfg.algorithm
    temperature = cfg.rollout.sampling.temperature or 1.0
    t_step = time.perf_counter()
    # 1. Rollout: n samples per prompt (sync: all episodes of the batch now, concurrently, + DAPO dynamic
    #    sampling; async: the oldest admissible groups the producer made meanwhile).
    t0 = time.perf_counter()
    sampled, trajs, batch_metrics = await (sample_step(run, step) if run.producer is None else _take_groups(run))
    t_generate = time.perf_counter() - t0
    # 2. Rewards -> shaped rewards (length terms, KL in reward mode) -> critic values (gae) -> advantages.
    batch = collate(trajs, None, run.chat.tokenizer.pad_token_id or 0)
    reward_kl = run.ref is not None and alg.kl_mode == "reward"
    ref_logp = (
        logprobs_no_grad(run.ref, batch, cfg.trainer.micro_batch_size, temperature, cfg.trainer.shared_prefix)
        if reward_kl
        else None
    )
    values = None if run.critic is None else run.critic.values(batch)
    adv_metrics = assign_advantages(
        batch,
        alg,
        max_response_length=cfg.rollout.max_generate_length,
        ref_logp=ref_logp,
        kl_coef=run.algo.kl.value,
        values=values,
    )
    # 3. Policy (and critic) update on exactly the sampled token ids, in a thread: async rollouts and tool calls go
    #    on meanwhile; then KL controller, health checks, reference refresh.
    t0 = time.perf_counter()
    update_metrics = await asyncio.to_thread(_update, run, batch, temperature)
    state_metrics = run.algo.after_update({**adv_metrics, **update_metrics}, len(trajs))
    reference.maybe_refresh(run.ref, run.policy, alg, step + 1)
    t_train = time.perf_counter() - t0
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
        **adv_metrics,
        **update_metrics,
        **state_metrics,
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


def _update(run: RLRun, batch: TokenBatch, temperature: float) -> dict[str, float]:
    """One policy update (and, with a critic, its value-loss update) on the batch."""
    if run.update_threads:
        torch.set_num_threads(run.update_threads)  # this worker thread only (OpenMP thread counts are per thread)
    metrics = policy_update(
        run.policy,
        run.ref,
        batch,
        run.cfg.algorithm,
        run.cfg.trainer,
        run.optimizer,
        run.scheduler,
        temperature,
        kl_coef=run.algo.kl.value,
        guard=run.algo.guard,
        rollout_is_behaviour=run.producer is not None,
    )
    if run.critic is not None:
        metrics.update(run.critic.update(batch))
    return metrics


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


async def evaluate_held_out(run: SamplingRun, label: str) -> EvalResult:
    result, trajs = await evaluate(
        run.engine, run.make_env, run.chat, run.held_out, run.limits, run.cfg.eval.temperature, seed=run.cfg.seed
    )
    dump_trajectories(run.cfg.run_dir / "trajectories" / f"eval_{label}.jsonl", trajs)
    (run.cfg.run_dir / f"eval_{label}.json").write_text(json.dumps(result.__dict__))
    return result


def _save_checkpoint(run: RLRun, step: int) -> None:
    extra = {
        "step": step,
        "sampler": run.sampler.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "kl_coef": run.algo.kl.value,
    }

    def write(directory: Path) -> None:
        save_training_state(directory, run.policy, run.optimizer, step, extra=extra)
        if run.critic is not None:
            run.critic.save(directory / CRITIC_DIR)

    run.checkpoints.save(step, write)


def _export(run: RLRun) -> Path:
    out = run.cfg.run_dir / "export"
    components.export_policy(run.policy, run.chat, out)
    return out


async def train(cfg: RunConfig) -> dict[str, Any]:
    run = setup(cfg)
    try:
        before_path = cfg.run_dir / "eval_before.json"
        if cfg.eval.before and before_path.exists():
            before = EvalResult(**json.loads(before_path.read_text()))
        elif cfg.eval.before:
            before = await evaluate_held_out(run, "before")
            run.logger.log(0, before.as_metrics())  # step 0 on the reward plot
        else:
            before = None
        if run.start_step:
            await run.engine.update_weights(components.engine_weights(run.policy))
        if cfg.trainer.max_off_policy_steps > 0:
            run.producer = _start_producer(run)
        samples_per_step = cfg.trainer.prompts_per_step * cfg.trainer.group_size
        with StepProgress(cfg.trainer.steps, f"GRPO {cfg.env.name}", cfg.monitor.progress) as progress:
            progress.update(run.start_step)
            for step in range(run.start_step, cfg.trainer.steps):
                metrics = await rl_step(run, step)
                metrics["progress/samples"] = float((step + 1) * samples_per_step)
                if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.trainer.steps:
                    metrics.update((await evaluate_held_out(run, f"step_{step + 1}")).as_metrics())
                run.logger.log(step + 1, metrics)
                progress.update(step + 1, {"reward": metrics["reward/mean"], "step_s": metrics["time/step"]})
                if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                    _save_checkpoint(run, step + 1)
        if run.producer is not None:
            await run.producer.stop()
        after = await evaluate_held_out(run, "after")
        run.logger.log(cfg.trainer.steps, after.as_metrics())
        if not cfg.checkpoint.every or cfg.trainer.steps % cfg.checkpoint.every:
            _save_checkpoint(run, cfg.trainer.steps)
        _export(run)
        plot_run(cfg.run_dir / "metrics.jsonl", cfg.run_dir)
        print_summary(cfg, before, after)
        return {"before": None if before is None else before.__dict__, "after": after.__dict__}
    finally:
        if run.producer is not None:
            await run.producer.stop()
        run.logger.close()
        await run.engine.close()
        await close_default_pool()


def print_summary(cfg: RunConfig, before: EvalResult | None, after: EvalResult) -> None:
    rows = [
        [label, f"{r.success:.3f}", f"{r.reward:.3f}", f"{r.turns:.2f}", str(r.n)]
        for label, r in (("before", before), ("after", after))
        if r is not None
    ]
    title = f"held-out {cfg.env.name} (temperature {cfg.eval.temperature})"
    print_table(title, ["policy", "success", "mean reward", "mean turns", "n"], rows)


def run_rl(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train(cfg))
