"""`thermik eval`: held-out success of the model at model.path, sampled as configured in eval.*."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from thermik.config.schema import RunConfig
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.evaluation import evaluate
from thermik.tools.mcp_pool import MCPPool
from thermik.training import components


async def _eval(cfg: RunConfig) -> dict[str, Any]:
    components.seed_everything(cfg.seed)
    policy, chat = components.load_policy(cfg.model)
    engine = components.build_engine(policy, chat, cfg.inference)
    _, held_out = components.load_datasets(cfg.data, cfg.env.name)
    limits = LoopLimits.from_config(cfg.rollout, cfg.env.max_turns)
    pool = MCPPool(log_dir=cfg.run_dir / "logs")
    try:
        result, _ = await evaluate(
            engine,
            components.env_factory(cfg.env, pool),
            chat,
            held_out[: cfg.eval.size],
            limits,
            cfg.eval.temperature,
            seed=cfg.seed,
        )
    finally:
        await engine.close()
        await pool.aclose()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "eval.json").write_text(json.dumps(result.__dict__))
    return {"model": cfg.model.path, **result.__dict__}


def run_eval(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(_eval(cfg))
