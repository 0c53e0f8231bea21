"""A few GRPO steps on Ray from a config, then the weight-broadcast time of both sync methods.

    python -m thermik.distributed.demo @ config.toml --distributed.num_trainers 2 --trainer.steps 3

Rollouts run on the engine actors (through EnginePool), the update on the data-parallel trainer workers.
This is the reference use of thermik.distributed.launch; `thermik rl` calls the same functions.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import torch

from thermik.algorithms import registry
from thermik.config import load_config
from thermik.config.schema import RunConfig
from thermik.data.sampler import PromptSampler
from thermik.distributed.launch import DistributedRun, start
from thermik.models.loading import load_tokenizer
from thermik.rollout.agent_loop import LoopLimits, rollout_rows
from thermik.rollout.tokenization import ChatTokenizer
from thermik.tools.mcp_pool import close_default_pool
from thermik.training import components
from thermik.training.batch import collate


async def rl_steps(run: DistributedRun) -> list[dict[str, float]]:
    cfg = run.cfg
    chat = ChatTokenizer(load_tokenizer(cfg.model.path))
    train_rows, _ = components.load_datasets(cfg.data, cfg.env.name)
    sampler = PromptSampler(train_rows, cfg.data.seed)
    limits = LoopLimits.from_config(cfg.rollout, cfg.env.max_turns)
    make_env = components.env_factory(cfg.env)
    adv_fn = registry.get("advantage", cfg.algorithm.advantage)
    history = []
    for step in range(cfg.trainer.steps):
        t0 = time.perf_counter()
        # 1. Rollout on the engine actors.
        rows = sampler.next_batch(cfg.trainer.prompts_per_step)
        seed = cfg.seed * 1_000_003 + step * 10_007
        trajs = await rollout_rows(
            run.engines, make_env, chat, rows, cfg.trainer.group_size, limits, cfg.rollout.sampling, seed=seed
        )
        t_generate = time.perf_counter() - t0
        # 2. Advantages, 3. data-parallel update, 4. weight sync.
        rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
        adv, _ = adv_fn(rewards, torch.tensor([t.group_id for t in trajs]), cfg.algorithm.std_eps)
        batch = collate(trajs, adv, chat.tokenizer.pad_token_id or 0)
        t1 = time.perf_counter()
        metrics = await run.update(batch, cfg.algorithm, cfg.trainer, cfg.rollout.sampling.temperature or 1.0)
        t_train = time.perf_counter() - t1
        version, t_sync = await run.sync_weights()
        metrics.update(
            {"reward/mean": float(rewards.mean()), "weights/version": version, "time/generate": t_generate,
             "time/train": t_train, "time/weight_sync": t_sync, "time/step": time.perf_counter() - t0}
        )  # fmt: skip
        history.append(metrics)
        print(
            f"step {step + 1}: reward {metrics['reward/mean']:.3f} loss {metrics['policy/loss']:+.4f} "
            f"grad_norm {metrics['policy/grad_norm']:.3f} generate {t_generate:.2f}s train {t_train:.2f}s "
            f"weight_sync {t_sync * 1000:.1f}ms (version {version})",
            flush=True,
        )
    return history


async def weight_sync_times(run: DistributedRun, repeats: int = 5) -> dict[str, float]:
    """Median seconds of one trainer -> engines weight sync per method (the first call, which forms the
    broadcast group, is excluded)."""
    out = {}
    for method in ("collective", "files"):
        await run.sync_weights(method)
        times = [(await run.sync_weights(method))[1] for _ in range(repeats)]
        out[method] = statistics.median(times)
    return out


async def _main(cfg: RunConfig) -> None:
    run = start(cfg)
    try:
        await rl_steps(run)
        if cfg.distributed.num_engines:
            for method, seconds in (await weight_sync_times(run)).items():
                print(f"weight sync {method}: {seconds * 1000:.1f} ms (median of 5)")
    finally:
        run.shutdown()
        await close_default_pool()


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(RunConfig, sys.argv[1:] if argv is None else argv)
    asyncio.run(_main(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
