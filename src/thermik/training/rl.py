"""Synchronous GRPO: rollout -> rewards -> advantages -> update -> weight sync -> log, one step at a time."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from thermik.algorithms import registry
from thermik.config.loader import dump_toml
from thermik.config.schema import RunConfig
from thermik.data.sampler import PromptSampler
from thermik.eval.evaluate import EvalResult, evaluate
from thermik.inference.embedded import EmbeddedEngine
from thermik.monitor.metrics import MetricsLogger
from thermik.monitor.plots import plot_run
from thermik.monitor.progress import StepProgress, print_table
from thermik.rollout.agent_loop import EnvFactory, LoopLimits, rollout_rows
from thermik.rollout.metrics import rollout_metrics
from thermik.rollout.tokenization import ChatTokenizer
from thermik.rollout.trajectory import dump_trajectories
from thermik.tools.mcp_pool import close_default_pool, configure_default_pool
from thermik.training import components
from thermik.training.batch import collate
from thermik.training.checkpoint import CheckpointManager, load_training_state, save_training_state
from thermik.training.optim import build_optimizer
from thermik.training.update import policy_update


@dataclass
class RLRun:
    """Everything one RL run holds; built once by `setup`, read by `rl_step`."""

    cfg: RunConfig
    policy: torch.nn.Module
    ref: torch.nn.Module | None
    chat: ChatTokenizer
    engine: EmbeddedEngine
    make_env: EnvFactory
    sampler: PromptSampler
    held_out: list[dict[str, Any]]
    limits: LoopLimits
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpoints: CheckpointManager
    logger: MetricsLogger
    start_step: int = 0


def setup(cfg: RunConfig) -> RLRun:
    components.seed_everything(cfg.seed)
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(cfg))
    configure_default_pool(log_dir=run_dir / "logs")  # each MCP server's stderr: logs/mcp-<name>.log
    policy, chat = components.load_policy(cfg.model)
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = copy.deepcopy(policy).eval().requires_grad_(False)
    train_rows, held_out = components.load_datasets(cfg.data, cfg.env.name)
    optimizer, scheduler = build_optimizer(policy, cfg.trainer.optimizer)
    run = RLRun(
        cfg=cfg,
        policy=policy,
        ref=ref,
        chat=chat,
        engine=components.build_engine(policy, chat, cfg.inference),
        make_env=components.env_factory(cfg.env),
        sampler=PromptSampler(train_rows, cfg.data.seed),
        held_out=held_out[: cfg.eval.size],
        limits=LoopLimits.from_config(cfg.rollout, cfg.env.max_turns),
        optimizer=optimizer,
        scheduler=scheduler,
        checkpoints=CheckpointManager(run_dir / "checkpoints", keep=cfg.checkpoint.keep),
        logger=MetricsLogger(run_dir, tensorboard=cfg.monitor.tensorboard, wandb_project=cfg.monitor.wandb_project),
    )
    latest = run.checkpoints.latest() if cfg.checkpoint.resume else None
    if latest is not None:
        extra = load_training_state(latest, policy, optimizer)
        run.start_step = int(extra["step"])
        run.sampler.load_state_dict(extra["sampler"])
        scheduler.load_state_dict(extra["scheduler"])
        run.logger.truncate_after(run.start_step + 1)  # steps <= start_step are done and kept
        print(f"resumed {cfg.run_dir} from {latest.name} (step {run.start_step} of {cfg.trainer.steps})")
    return run


async def rl_step(run: RLRun, step: int) -> dict[str, float]:
    cfg = run.cfg
    t_step = time.perf_counter()
    # 1. Rollout: n samples per prompt, all episodes of the batch concurrently.
    rows = run.sampler.next_batch(cfg.trainer.prompts_per_step)
    t0 = time.perf_counter()
    trajs = await rollout_rows(
        run.engine,
        run.make_env,
        run.chat,
        rows,
        cfg.trainer.group_size,
        run.limits,
        cfg.rollout.sampling,
        seed=cfg.seed * 1_000_003 + step * 10_007,
    )
    t_generate = time.perf_counter() - t0
    # 2. Rewards -> group-relative advantages, one per trajectory.
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    group_ids = torch.tensor([t.group_id for t in trajs])
    adv_fn = registry.get("advantage", cfg.algorithm.advantage)
    adv, adv_metrics = adv_fn(rewards, group_ids, cfg.algorithm.std_eps)
    # 3. Policy update on exactly the sampled token ids.
    t0 = time.perf_counter()
    batch = collate(trajs, adv, run.chat.tokenizer.pad_token_id or 0)
    update_metrics = policy_update(
        run.policy,
        run.ref,
        batch,
        cfg.algorithm,
        cfg.trainer,
        run.optimizer,
        run.scheduler,
        cfg.rollout.sampling.temperature or 1.0,
    )
    t_train = time.perf_counter() - t0
    # 4. Weight sync: trainer weights -> engine, version + 1.
    t0 = time.perf_counter()
    version = await run.engine.update_weights(run.policy.state_dict())
    t_sync = time.perf_counter() - t0
    # 5. Log.
    sampled_tokens = sum(t.num_generated_tokens for t in trajs)
    step_s = time.perf_counter() - t_step
    metrics = {
        **rollout_metrics(trajs),
        **{k: float(v) for k, v in adv_metrics.items()},
        **update_metrics,
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
        dump_trajectories(cfg.run_dir / "trajectories" / f"step_{step + 1}.jsonl", trajs)
    return metrics


async def _evaluate(run: RLRun, label: str) -> EvalResult:
    result, trajs = await evaluate(
        run.engine, run.make_env, run.chat, run.held_out, run.limits, run.cfg.eval.temperature, seed=run.cfg.seed
    )
    dump_trajectories(run.cfg.run_dir / "trajectories" / f"eval_{label}.jsonl", trajs)
    (run.cfg.run_dir / f"eval_{label}.json").write_text(json.dumps(result.__dict__))
    return result


def _save_checkpoint(run: RLRun, step: int) -> None:
    extra = {"step": step, "sampler": run.sampler.state_dict(), "scheduler": run.scheduler.state_dict()}
    run.checkpoints.save(step, lambda d: save_training_state(d, run.policy, run.optimizer, step, extra=extra))


def _export(run: RLRun) -> Path:
    out = run.cfg.run_dir / "export"
    run.policy.save_pretrained(out, safe_serialization=True)
    run.chat.tokenizer.save_pretrained(out)
    return out


async def train(cfg: RunConfig) -> dict[str, Any]:
    run = setup(cfg)
    try:
        before_path = cfg.run_dir / "eval_before.json"
        if cfg.eval.before and before_path.exists():
            before = EvalResult(**json.loads(before_path.read_text()))
        elif cfg.eval.before:
            before = await _evaluate(run, "before")
            run.logger.log(0, before.as_metrics())  # step 0 on the reward plot
        else:
            before = None
        if run.start_step:
            await run.engine.update_weights(run.policy.state_dict())
        with StepProgress(cfg.trainer.steps, f"GRPO {cfg.env.name}", cfg.monitor.progress) as progress:
            progress.update(run.start_step)
            for step in range(run.start_step, cfg.trainer.steps):
                metrics = await rl_step(run, step)
                if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.trainer.steps:
                    metrics.update((await _evaluate(run, f"step_{step + 1}")).as_metrics())
                run.logger.log(step + 1, metrics)
                progress.update(step + 1, {"reward": metrics["reward/mean"], "step_s": metrics["time/step"]})
                if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                    _save_checkpoint(run, step + 1)
        after = await _evaluate(run, "after")
        run.logger.log(cfg.trainer.steps, after.as_metrics())
        if not cfg.checkpoint.every or cfg.trainer.steps % cfg.checkpoint.every:
            _save_checkpoint(run, cfg.trainer.steps)
        _export(run)
        plot_run(cfg.run_dir / "metrics.jsonl", cfg.run_dir)
        _print_summary(cfg, before, after)
        return {"before": None if before is None else before.__dict__, "after": after.__dict__}
    finally:
        run.logger.close()
        await run.engine.close()
        await close_default_pool()


def _print_summary(cfg: RunConfig, before: EvalResult | None, after: EvalResult) -> None:
    rows = [
        [label, f"{r.success:.3f}", f"{r.reward:.3f}", f"{r.turns:.2f}", str(r.n)]
        for label, r in (("before", before), ("after", after))
        if r is not None
    ]
    title = f"held-out {cfg.env.name} (temperature {cfg.eval.temperature})"
    print_table(title, ["policy", "success", "mean reward", "mean turns", "n"], rows)


def run_rl(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train(cfg))
