"""`thermik eval`: held-out success of the model at model.path, sampled as configured in eval.*."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from thermik.config.schema import RunConfig
from thermik.rollout.evaluation import evaluate
from thermik.runs.build import build_run
from thermik.training import components


async def _eval(cfg: RunConfig) -> dict[str, Any]:
    engine = lambda policy, chat: components.build_engine(policy, chat, cfg.inference)  # noqa: E731
    run = build_run(cfg, lora=False, engine=engine, train_rows=False, learner=False)
    ctx = run.rollout
    assert ctx is not None
    try:
        result, _ = await evaluate(
            ctx.engine, ctx.make_env, ctx.chat, ctx.held_out, ctx.limits, cfg.eval.temperature, seed=cfg.seed
        )
    finally:
        await run.close()
    (cfg.run_dir / "eval.json").write_text(json.dumps(result.__dict__))
    return {"model": cfg.model.path, **result.__dict__}


def run_eval(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(_eval(cfg))
