"""`thermik sft`: supervised fine-tuning on chat conversations (training/sft.py) in the one outer loop.

Checkpoints every `checkpoint.every` steps; a restarted run resumes from the newest one and continues bit for bit
(the data position is in the checkpoint). Optionally stops early once sampled held-out success reaches a threshold:
when a tiny model learns to copy varies by seed, so a threshold is a sturdier recipe than a fixed step count.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import torch

from thermik.assembly import components
from thermik.atomic import publish_dir
from thermik.config.schema import InferenceConfig, SamplingConfig, SFTConfig
from thermik.data.conversations import DataOrder, Example, encode_all, load_conversations, trains, truncate
from thermik.data.disk import load_rows_from
from thermik.inference.base import InferenceEngine
from thermik.models.context_window import context_window
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.evaluation import EvalResult, engine_player, evaluate, write_records
from thermik.runs.build import Run, open_run, resume_logger
from thermik.runs.held_out_stop import HeldOutStop
from thermik.runs.loop import LoopPlan, Mode, run_loop
from thermik.runs.verdict import sft_verdict
from thermik.tasks.registry import generate_rows
from thermik.training.checkpoint import CheckpointManager
from thermik.training.mixed_precision import autocast_dtype
from thermik.training.optim import build_optimizer
from thermik.training.sft import auto_micro_batch_tokens, restore_sft_checkpoint, save_sft_checkpoint, sft_update


class SFTMode(Mode):
    """The loop hooks of `thermik sft`: one optimizer step per loop step, the held-out check as its evaluation."""

    def __init__(self, run: Run, cfg: SFTConfig) -> None:
        assert run.policy is not None
        self.run, self.cfg, self.model, self.chat = run, cfg, run.policy, run.chat
        rows = load_conversations(cfg.train_path, cfg.columns, cfg.train_split)
        full = encode_all(self.chat, rows, 0, cfg.env.render_tools, cfg.train_roles)
        window = context_window(cfg.model.path, self.chat.tokenizer)
        self.max_length = cfg.max_length or min(window, max(len(ids) for ids, _ in full))
        self.examples = truncate(full, self.max_length)
        check_sft_data(cfg, self.max_length, full, self.examples)
        self.order = DataOrder(len(self.examples), cfg.seed)
        self.pack_tokens = (cfg.pack_length or self.max_length) if cfg.packing else 0
        self.micro_batch_tokens = cfg.micro_batch_tokens or auto_micro_batch_tokens(self.model, self.max_length)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optimizer)
        self.autocast = autocast_dtype(cfg.model, self.model)
        self.checkpoints = CheckpointManager(cfg.run_dir / "checkpoints", keep=cfg.checkpoint.keep)
        self.engine: InferenceEngine | None = None  # built by the first held-out check
        self.make_env = components.env_factory(cfg.env, run.pool)
        self.held_out = (
            load_rows_from(cfg.eval_path, cfg.columns, cfg.env.name, cfg.eval_split)[: cfg.eval_size]
            if cfg.eval_path
            else generate_rows(cfg.env.name, cfg.eval_size, cfg.seed, split="eval", options=cfg.env)
        )
        self.limits = LoopLimits.from_config(cfg.rollout, cfg.env.max_turns, window)
        self.result: dict[str, Any] = {"steps": 0, "success": None, "reward": None}
        self.held_out_stop = HeldOutStop.from_config(cfg)
        self._resume()

    def _resume(self) -> None:
        """Continue from the newest checkpoint (checkpoint.resume); a fresh start drops the log a previous run left."""
        latest = self.checkpoints.latest() if self.cfg.checkpoint.resume else None
        if latest is None:
            self.run.logger.truncate_after(0)
            return
        extra = restore_sft_checkpoint(latest, self.model, self.optimizer, self.scheduler)
        self.order.position = int(extra["data_position"])
        self.held_out_stop.load(extra.get("held_out", {}))
        self.result["steps"] = int(extra["step"])
        resume_logger(self.run, int(extra["step"]), {"position": self.order.position})

    async def step(self, step: int) -> dict[str, float]:
        batch = [self.examples[i] for i in self.order.next_batch(self.cfg.batch_size)]
        pad = self.chat.tokenizer.pad_token_id or 0
        self.result["steps"] = step + 1
        opt = self.cfg.optimizer
        return sft_update(
            self.model, batch, pad, self.optimizer, self.scheduler, opt.max_grad_norm, self.autocast, self.pack_tokens,
            self.micro_batch_tokens,
        )  # fmt: skip

    def save(self, step: int) -> None:
        save_sft_checkpoint(
            self.checkpoints,
            step,
            self.model,
            self.optimizer,
            self.scheduler,
            self.order.position,
            self.held_out_stop.state(),
        )

    def evaluates_at(self, step: int) -> bool:
        return self.held_out_stop.checks_at(step)

    async def evaluate(self, label: str) -> EvalResult:
        if self.engine is None:
            # The check samples with the current weights, pushed into an engine of its own, in the trainer's
            # precision: bfloat16 beside a bf16-mixed trainer, the model's dtype beside a plain one.
            precision, asked_by = held_out_precision(self.cfg.model.train_precision, self.autocast)
            inference = InferenceConfig(seed=self.cfg.seed, precision=precision)
            self.engine = components.build_engine(self.model, self.chat, inference, precision_asked_by=asked_by)
        await self.engine.update_weights(components.engine_weights(self.model))
        sampling = SamplingConfig(temperature=self.cfg.eval_temperature)
        play = engine_player(self.engine, self.make_env, self.chat, self.limits, sampling)
        env = self.cfg.env
        result, records = await evaluate(
            play, self.held_out, seed=self.cfg.seed, chat=self.chat, tool_parser=env.tool_parser, env_name=env.name
        )
        write_records(self.cfg.run_dir / "trajectories" / f"eval_{label}.jsonl", records)
        self.result.update(success=result.success, reward=result.reward)
        self.held_out_stop.record(self.result[self.cfg.stop_metric])
        return result

    def done(self, step: int, metrics: dict[str, float]) -> bool:
        return self.held_out_stop.reached()

    def export(self) -> None:
        """run_dir/model, atomically (complete or absent): the merged model, with LoRA also its adapter/."""
        publish_dir(self.cfg.run_dir / "model", lambda tmp: components.export_policy(self.model, self.chat, tmp))


def held_out_precision(train_precision: str, autocast: torch.dtype | None) -> tuple[str, str]:
    """(inference precision, what asked for it) of the held-out check: the trainer's precision, which
    model.train_precision chose (`autocast`: bfloat16 under bf16-mixed, None for the model's dtype)."""
    setting = f"(model.train_precision = {train_precision!r})"
    if autocast is not None:
        return "bfloat16", f"the held-out check samples in the trainer's precision, bf16-mixed {setting}"
    return "model", f"the held-out check samples in the trainer's precision {setting}"


def check_sft_data(cfg: SFTConfig, max_length: int, full: list[Example], cut: list[Example]) -> None:
    """Before any step: some conversation keeps a trained token after the cut to max_length (else NothingDoneError);
    warns when many lost theirs (failures.max_skipped_share)."""
    lost = [f for f, c in zip(full, cut, strict=True) if trains(f) and not trains(c)]
    counts = {"conversations/kept": float(sum(map(trains, cut))), "conversations/cut": float(len(lost))}
    if lost:
        counts["conversations/first_trained"] = float(min(f[1].index(1, 1) for f in lost))
    verdict = sft_verdict(cfg.failures, max_length, cfg.train_roles)
    verdict.observe(counts)
    verdict.conclude()


async def _sft(cfg: SFTConfig) -> dict[str, Any]:
    run = open_run(cfg)
    mode = SFTMode(run, cfg)
    plan = LoopPlan(
        title="SFT",
        steps=cfg.max_steps,
        checkpoint_every=cfg.checkpoint.every,
        show=(("loss", "sft/loss"), ("success", "eval/success")),
        progress=cfg.progress,
    )
    try:
        await run_loop(mode, run, plan)
    finally:
        if mode.engine is not None:
            await mode.engine.close()
        await run.close()
    (cfg.run_dir / "sft_result.json").write_text(json.dumps(mode.result))
    return mode.result


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    return asyncio.run(_sft(cfg))
