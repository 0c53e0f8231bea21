"""Supervised fine-tuning: the loss on the trained tokens of a batch of conversations, one optimizer step, and the
checkpoint of an SFT run (model, optimizer, RNG, scheduler and data position: a resumed run continues bit for bit).

Conversations arrive tokenized by the function the agent loop uses (data/conversations.py), so SFT sequences are
byte-identical to what the policy will see during RL. With packing the conversations of a batch share rows, each
attending only to itself (training/packing.py): the per-token loss equals the padded batch's to float rounding.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from thermik.training.batch import model_device, token_logprobs
from thermik.training.checkpoint import CheckpointManager, load_training_state, save_training_state
from thermik.training.mixed_precision import train_autocast
from thermik.training.packing import pack_for, packed_token_logprobs, unpack

Example = tuple[list[int], list[int]]  # (token ids, loss mask), as data/conversations.py encodes them


def sft_token_logprobs(
    model: torch.nn.Module, examples: list[Example], pad_id: int, pack_tokens: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [B, W-1] of each next token, loss mask [B, W-1]) of the examples as a right-padded batch of width W;
    pack_tokens > 0 computes them on packed rows of that many tokens (the longest example at least)."""
    width = max(len(ids) for ids, _ in examples)
    rows = [(ids, m, width - len(ids)) for ids, m in examples]
    device = model_device(model)  # each tensor built once, where the model lives
    mask = torch.tensor([m[1 : len(ids)] + [0] * pad for ids, m, pad in rows], dtype=torch.float32, device=device)
    if pack_tokens:
        packed = pack_for(model, [ids for ids, _ in examples], pack_tokens, pad_id)
        logp, _ = packed_token_logprobs(model, packed, entropy_grad=False)
        return unpack(logp, packed, width), mask
    input_ids = torch.tensor([ids + [pad_id] * pad for ids, _, pad in rows], device=device)
    attention = torch.tensor([[1] * len(ids) + [0] * pad for ids, _, pad in rows], device=device)
    logp, _ = token_logprobs(model, input_ids, attention, entropy_grad=False)
    return logp, mask


def sft_loss(
    model: torch.nn.Module,
    examples: list[Example],
    pad_id: int,
    autocast: torch.dtype | None = None,
    pack_tokens: int = 0,
    num_trained: int | None = None,
) -> torch.Tensor:
    """Negative log-likelihood of the trained tokens of `examples`, divided by `num_trained` (default: their own count,
    the mean; a micro-batch divides by its whole batch's count so that the micro-batches' gradients add up to the
    batch's). Autocast: training/mixed_precision.py; the logprobs are float32 either way."""
    with train_autocast(model, autocast):
        logp, mask = sft_token_logprobs(model, examples, pad_id, pack_tokens)
    return -(logp * mask).sum() / (mask.sum().clamp(min=1) if num_trained is None else max(num_trained, 1))


def trained_tokens(examples: list[Example]) -> int:
    """Tokens the loss counts: the mask after the first position (a first token has no prediction)."""
    return sum(sum(m[1 : len(ids)]) for ids, m in examples)


ACTIVATION_BUDGET_BYTES = 2**30  # what one micro-batch's forward and backward may hold, when nothing says otherwise


def auto_micro_batch_tokens(model: torch.nn.Module, max_length: int) -> int:
    """Tokens per micro-batch whose float32 activations take about ACTIVATION_BUDGET_BYTES: per token and layer the
    saved inputs of norms, projections and the gated MLP (~12 hidden + 4 intermediate values) and a row of attention
    probabilities (heads x max_length), plus ~3 vocabulary-sized values (logits, log-softmax, their gradient)."""
    cfg = model.config
    per_layer = 12 * cfg.hidden_size + 4 * cfg.intermediate_size + cfg.num_attention_heads * max_length
    per_token = 4 * (cfg.num_hidden_layers * per_layer + 3 * cfg.vocab_size)
    return max(1, ACTIVATION_BUDGET_BYTES // per_token)


def micro_batches(examples: list[Example], max_tokens: int) -> list[list[Example]]:
    """Consecutive runs of `examples` whose padded size (count x longest) stays within `max_tokens` (one example at
    least each): the activations of a forward and backward grow with it, the gradient does not (docs/sft.md)."""
    chunks: list[list[Example]] = [[]]
    for example in examples:
        chunk = chunks[-1]
        if chunk and (len(chunk) + 1) * max(len(e[0]) for e in [*chunk, example]) > max_tokens:
            chunks.append(chunk := [])
        chunk.append(example)
    return chunks


def sft_update(
    model: torch.nn.Module,
    batch: list[Example],
    pad: int,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float,
    autocast: torch.dtype | None = None,
    pack_tokens: int = 0,
    micro_batch_tokens: int = 0,
) -> dict[str, float]:
    """One optimizer step on a batch of encoded conversations, its forward and backward in micro-batches of at most
    `micro_batch_tokens` padded tokens (0: the whole batch at once)."""
    t0 = time.perf_counter()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    num_trained, loss = trained_tokens(batch), torch.zeros(())
    for chunk in micro_batches(batch, micro_batch_tokens) if micro_batch_tokens else [batch]:
        part = sft_loss(model, chunk, pad, autocast, pack_tokens, num_trained)
        part.backward()
        loss += part.detach().cpu()
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    scheduler.step()
    return {"sft/loss": float(loss.detach()), "sft/grad_norm": float(grad_norm), "time/step": time.perf_counter() - t0}


def save_sft_checkpoint(
    checkpoints: CheckpointManager,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data_position: int,
    held_out: dict[str, Any] | None = None,
) -> Path:
    """checkpoints/step_<step>: weights (the adapter with LoRA), optimizer, RNG, scheduler, data position and the
    held-out check's state (`held_out`, kept as given)."""
    extra = {
        "step": step,
        "scheduler": scheduler.state_dict(),
        "data_position": data_position,
        "held_out": held_out or {},
    }
    return checkpoints.save(step, lambda d: save_training_state(d, model, optimizer, step, extra=extra))


def restore_sft_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Load a checkpoint of `save_sft_checkpoint` in place; returns {"step", "data_position", ...}."""
    extra = load_training_state(directory, model, optimizer)
    scheduler.load_state_dict(extra["scheduler"])
    return extra
