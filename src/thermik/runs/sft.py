"""`thermik sft`: supervised fine-tuning on chat conversations (training/sft.py) in the one outer loop.

Optionally stops early once sampled held-out success reaches a threshold: when a tiny model learns to copy varies
by seed, so a threshold is a sturdier recipe than a fixed step count (FIELD-NOTES).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from thermik.config.schema import InferenceConfig, SamplingConfig, SFTConfig
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.evaluation import EvalResult, engine_player, evaluate, write_records
from thermik.runs.build import Run, open_run
from thermik.runs.loop import LoopPlan, Mode, run_loop
from thermik.tasks.registry import generate_rows
from thermik.training import components
from thermik.training.optim import build_optimizer
from thermik.training.precision import autocast_dtype
from thermik.training.sft import encode_all, load_conversations, save_model, sft_update


class SFTMode(Mode):
    """The loop hooks of `thermik sft`: one optimizer step per loop step, the held-out check as its evaluation."""

    def __init__(self, run: Run, cfg: SFTConfig) -> None:
        assert run.policy is not None
        self.run, self.cfg, self.model, self.chat = run, cfg, run.policy, run.chat
        self.examples = encode_all(self.chat, load_conversations(cfg.train_path), cfg.max_length, cfg.env.render_tools)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optimizer)
        self.autocast = autocast_dtype(cfg.model, self.model)
        # The held-out check samples with the current weights, pushed into an engine of its own, in the trainer's
        # precision: bfloat16 beside a bf16-mixed trainer, the model's dtype beside a plain one.
        precision = "bfloat16" if self.autocast is not None else "model"
        self.engine = components.build_engine(
            self.model, self.chat, InferenceConfig(seed=cfg.seed, precision=precision)
        )
        self.make_env = components.env_factory(cfg.env, run.pool)
        self.held_out = generate_rows(cfg.env.name, cfg.eval_size, cfg.seed, split="eval")
        self.limits = LoopLimits.from_config(cfg.rollout, cfg.env.max_turns)
        self.rng = random.Random(cfg.seed)
        self.result: dict[str, Any] = {"steps": 0, "success": None, "reward": None}

    async def step(self, step: int) -> dict[str, float]:
        batch = self.rng.sample(self.examples, min(self.cfg.batch_size, len(self.examples)))
        pad = self.chat.tokenizer.pad_token_id or 0
        self.result["steps"] = step + 1
        opt = self.cfg.optimizer
        return sft_update(self.model, batch, pad, self.optimizer, self.scheduler, opt.max_grad_norm, self.autocast)

    async def evaluate(self, label: str) -> EvalResult:
        await self.engine.update_weights(self.model.state_dict())
        sampling = SamplingConfig(temperature=self.cfg.eval_temperature)
        play = engine_player(self.engine, self.make_env, self.chat, self.limits, sampling)
        env = self.cfg.env
        result, records = await evaluate(
            play, self.held_out, seed=self.cfg.seed, chat=self.chat, tool_parser=env.tool_parser, env_name=env.name
        )
        write_records(self.cfg.run_dir / "trajectories" / f"eval_{label}.jsonl", records)
        self.result.update(success=result.success, reward=result.reward)
        return result

    def done(self, step: int, metrics: dict[str, float]) -> bool:
        value = self.result[self.cfg.stop_metric]
        return value is not None and value >= self.cfg.stop_at and step >= self.cfg.min_steps

    def export(self) -> None:
        save_model(self.model, self.chat, self.cfg.run_dir / "model")


async def _sft(cfg: SFTConfig) -> dict[str, Any]:
    run = open_run(cfg)
    mode = SFTMode(run, cfg)
    plan = LoopPlan(
        title="SFT",
        steps=cfg.max_steps,
        eval_every=cfg.eval_every,
        eval_min_step=cfg.min_steps,
        checkpoint=False,
        show=(("loss", "sft/loss"), ("success", "eval/success")),
        progress=cfg.progress,
    )
    try:
        await run_loop(mode, run, plan)
    finally:
        await mode.engine.close()
        await run.close()
    (cfg.run_dir / "sft_result.json").write_text(json.dumps(mode.result))
    return mode.result


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    return asyncio.run(_sft(cfg))
