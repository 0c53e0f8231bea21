"""Supervised fine-tuning on chat conversations, loss on assistant tokens only.

Conversations are tokenized by the same function the agent loop uses (ChatTokenizer), so SFT
sequences are byte-identical to what the policy will see during RL. Optionally stops early once
sampled held-out success reaches a threshold: when a tiny model learns to copy varies by seed,
so a threshold is a sturdier recipe than a fixed step count (FIELD-NOTES).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from thermik.atomic import publish_dir
from thermik.config.loader import dump_toml
from thermik.config.schema import InferenceConfig, SFTConfig
from thermik.monitor.metrics import MetricsLogger
from thermik.monitor.plots import plot_run
from thermik.monitor.progress import StepProgress
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.evaluation import EvalResult, evaluate
from thermik.rollout.tokenization import ChatTokenizer
from thermik.rollout.trajectory import dump_trajectories
from thermik.tasks.registry import generate_rows
from thermik.tools.mcp_pool import MCPPool
from thermik.training import components
from thermik.training.batch import token_logprobs
from thermik.training.optim import build_optimizer


def load_conversations(path: str) -> list[dict[str, Any]]:
    if not path:
        raise ValueError("train_path is empty: pass --train_path FILE.jsonl (e.g. from `thermik synthesize`)")
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                row = json.loads(line)
                if "messages" not in row:
                    raise ValueError(f"{path}:{i}: row has no 'messages' field")
                rows.append(row)
    return rows


def encode_all(
    chat: ChatTokenizer, rows: list[dict[str, Any]], max_length: int, render_tools: bool = True
) -> list[tuple[list[int], list[int]]]:
    """Tokenize as the agent loop will: tools rendered exactly when env.render_tools is on."""
    out = []
    for row in rows:
        ids, mask = chat.encode_conversation(row["messages"], row.get("tools") if render_tools else None)
        out.append((ids[:max_length], mask[:max_length]))
    return out


def sft_loss(model: torch.nn.Module, examples: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean negative log-likelihood over assistant tokens of the batch."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    mask = torch.zeros((len(examples), width - 1))
    for i, (ids, m) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        mask[i, : len(ids) - 1] = torch.tensor(m[1:], dtype=torch.float32)
    logp, _ = token_logprobs(model, input_ids, attention)
    return -(logp * mask).sum() / mask.sum().clamp(min=1)


class HeldOutCheck:
    """Samples held-out episodes with the current weights (pushed into a separate engine)."""

    def __init__(self, cfg: SFTConfig, model: torch.nn.Module, chat: ChatTokenizer, pool: MCPPool) -> None:
        self.cfg, self.chat = cfg, chat
        self.engine = components.build_engine(model, chat, InferenceConfig(seed=cfg.seed))
        self.make_env = components.env_factory(cfg.env, pool)
        self.rows = generate_rows(cfg.env.name, cfg.eval_size, cfg.seed, split="eval")
        self.limits = LoopLimits.from_config(cfg.rollout, cfg.env.max_turns)

    async def __call__(self, model: torch.nn.Module, step: int) -> EvalResult:
        await self.engine.update_weights(model.state_dict())
        result, trajs = await evaluate(
            self.engine, self.make_env, self.chat, self.rows, self.limits, self.cfg.eval_temperature, self.cfg.seed
        )
        dump_trajectories(self.cfg.run_dir / "trajectories" / f"eval_step_{step}.jsonl", trajs)
        return result


def _sft_step(model: torch.nn.Module, batch: list, pad: int, optimizer, scheduler, max_grad_norm: float) -> dict:
    t0 = time.perf_counter()
    model.train()
    loss = sft_loss(model, batch, pad)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    return {"sft/loss": float(loss.detach()), "sft/grad_norm": float(grad_norm), "time/step": time.perf_counter() - t0}


async def _sft(cfg: SFTConfig) -> dict[str, Any]:
    components.seed_everything(cfg.seed)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "config.toml").write_text(dump_toml(cfg))
    model, chat = components.load_policy(cfg.model)
    examples = encode_all(chat, load_conversations(cfg.train_path), cfg.max_length, cfg.env.render_tools)
    optimizer, scheduler = build_optimizer(model, cfg.optimizer)
    pool = MCPPool(log_dir=cfg.run_dir / "logs")
    check = HeldOutCheck(cfg, model, chat, pool)
    logger = MetricsLogger(cfg.run_dir)
    rng = random.Random(cfg.seed)
    pad = chat.tokenizer.pad_token_id or 0
    result: dict[str, Any] = {"steps": 0, "success": None, "reward": None}
    try:
        with StepProgress(cfg.max_steps, "SFT", cfg.progress) as progress:
            for step in range(1, cfg.max_steps + 1):
                batch = rng.sample(examples, min(cfg.batch_size, len(examples)))
                metrics = _sft_step(model, batch, pad, optimizer, scheduler, cfg.optimizer.max_grad_norm)
                result["steps"] = step
                if cfg.eval_every and step % cfg.eval_every == 0 and step >= cfg.min_steps:
                    held_out = await check(model, step)
                    metrics.update(held_out.as_metrics())
                    result.update(success=held_out.success, reward=held_out.reward)
                logger.log(step, metrics)
                progress.update(step, {"loss": metrics["sft/loss"], "success": result["success"] or 0.0})
                reached = result[cfg.stop_metric] is not None and result[cfg.stop_metric] >= cfg.stop_at
                if reached and step >= cfg.min_steps:
                    break
        _save_model(model, chat, cfg.run_dir / "model")
        plot_run(cfg.run_dir / "metrics.jsonl", cfg.run_dir)
    finally:
        logger.close()
        await check.engine.close()
        await pool.aclose()
    (cfg.run_dir / "sft_result.json").write_text(json.dumps(result))
    return result


def _save_model(model: torch.nn.Module, chat: ChatTokenizer, out: Path) -> None:
    """Atomic: a model directory is complete or absent."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        chat.tokenizer.save_pretrained(tmp)

    publish_dir(out, write)


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    return asyncio.run(_sft(cfg))
