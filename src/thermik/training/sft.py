"""Supervised fine-tuning on chat conversations, loss on assistant tokens only.

Conversations are tokenized by the same function the agent loop uses (ChatTokenizer), so SFT
sequences are byte-identical to what the policy will see during RL. Optionally stops early once
sampled held-out success reaches a threshold: when a tiny model learns to copy varies by seed,
so a threshold is a sturdier recipe than a fixed step count (FIELD-NOTES).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from thermik.atomic import publish_dir
from thermik.rollout.tokenization import ChatTokenizer
from thermik.training.batch import token_logprobs
from thermik.training.precision import train_autocast


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


def sft_loss(
    model: torch.nn.Module,
    examples: list[tuple[list[int], list[int]]],
    pad_id: int,
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """Mean negative log-likelihood over assistant tokens of the batch (autocast: training/precision.py; the
    logprobs are float32 either way)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    mask = torch.zeros((len(examples), width - 1))
    for i, (ids, m) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        mask[i, : len(ids) - 1] = torch.tensor(m[1:], dtype=torch.float32)
    with train_autocast(model, autocast):
        logp, _ = token_logprobs(model, input_ids, attention)
    return -(logp * mask).sum() / mask.sum().clamp(min=1)


def sft_update(
    model: torch.nn.Module,
    batch: list,
    pad: int,
    optimizer,
    scheduler,
    max_grad_norm: float,
    autocast: torch.dtype | None = None,
) -> dict:
    """One optimizer step on a batch of encoded conversations."""
    t0 = time.perf_counter()
    model.train()
    loss = sft_loss(model, batch, pad, autocast)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    return {"sft/loss": float(loss.detach()), "sft/grad_norm": float(grad_norm), "time/step": time.perf_counter() - t0}


def save_model(model: torch.nn.Module, chat: ChatTokenizer, out: Path) -> None:
    """Atomic: a model directory is complete or absent."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        chat.tokenizer.save_pretrained(tmp)

    publish_dir(out, write)
