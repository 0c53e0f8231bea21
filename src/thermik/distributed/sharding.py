"""Cut a TokenBatch into data-parallel shards and compute each shard's gradient scale.

`policy_update` divides every mini-batch's loss by that mini-batch's token count (token_mean) or sequence
count (sequence_mean). On a shard it divides by the shard's count N_r, but the single-process gradient
divides by the global count N. Rank r's gradient therefore has to be multiplied by N_r / N before the
ranks' gradients are summed; DDP and FSDP2 average (sum / W), so the scale applied on rank r is
W * N_r / N. Derivation and proof: docs/distributed.md, "Global normalisation".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thermik.training.batch import TokenBatch


@dataclass(frozen=True)
class Shard:
    """One rank's rows plus its gradient scale per mini-batch (applied to the loss's gradient)."""

    batch: TokenBatch
    grad_scales: tuple[float, ...]
    num_tokens: int


def _split_evenly(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    size, extra = divmod(end - start, parts)
    bounds, at = [], start
    for i in range(parts):
        n = size + (1 if i < extra else 0)
        bounds.append((at, at + n))
        at += n
    return bounds


def _normalizer(batch: TokenBatch, reduction: str) -> float:
    """The denominator policy_update uses for one mini-batch (see training/loss.py, mini_batch_reduction): tokens,
    or sequences, counted in episodes where an episode trains as several rows (rollout.step_wise; an episode cut
    between two ranks is weighed by each rank's share of it: such a step is close to, not equal to, one process's)."""
    if reduction == "token_mean":
        return float(max(batch.num_tokens, 1))
    return float(len(torch.unique(batch.episode_ids)) if batch.episode_ids is not None else len(batch))


def _concat(pieces: list[TokenBatch]) -> TokenBatch:
    fields = pieces[0].__dict__.keys()
    return TokenBatch(
        *(None if getattr(pieces[0], f) is None else torch.cat([getattr(p, f) for p in pieces], dim=0) for f in fields)
    )


def shard_batch(batch: TokenBatch, world_size: int, mini_batches: int, reduction: str) -> list[Shard]:
    """Rank r gets the r-th contiguous part of every global mini-batch, so its own mini-batch k is exactly a
    part of global mini-batch k, and policy_update on the shard makes the same optimizer steps."""
    n = len(batch)
    if world_size < 1 or n < world_size:
        raise ValueError(
            f"shard_batch: {n} sequences cannot be shared by {world_size} trainer workers; "
            "send at least one sequence per worker (raise prompts_per_step or group_size)"
        )
    if mini_batches > 1 and n % (mini_batches * world_size):
        raise ValueError(
            f"shard_batch: with trainer.mini_batches={mini_batches} the batch size ({n}) must be a multiple of "
            f"mini_batches * num_trainers = {mini_batches * world_size}, so every rank cuts the same mini-batches"
        )
    per_mini = -(-n // mini_batches)
    pieces: list[list[TokenBatch]] = [[] for _ in range(world_size)]
    scales: list[list[float]] = [[] for _ in range(world_size)]
    for m_start in range(0, n, per_mini):
        m_end = min(m_start + per_mini, n)
        global_norm = _normalizer(batch.slice(m_start, m_end), reduction)
        for rank, (a, b) in enumerate(_split_evenly(m_start, m_end, world_size)):
            part = batch.slice(a, b)
            pieces[rank].append(part)
            scales[rank].append(world_size * _normalizer(part, reduction) / global_norm)
    shards = []
    for rank in range(world_size):
        local = _concat(pieces[rank])
        shards.append(Shard(batch=local, grad_scales=tuple(scales[rank]), num_tokens=local.num_tokens))
    return shards


def merge_metrics(per_rank: list[dict[str, float]], shards: list[Shard]) -> dict[str, float]:
    """Combine policy_update metrics of the ranks into the single-process values.

    Per-token averages are weighted by each rank's token count. The loss is reassembled from the ranks' losses
    and their scales (exact for one mini-batch, the mean scale otherwise). grad_norm and lr are the same on every
    rank (they are read after the gradient all-reduce).
    """
    total = max(sum(s.num_tokens for s in shards), 1)
    world = len(shards)
    out: dict[str, float] = {}
    pairs = list(zip(per_rank, shards, strict=True))
    for key in per_rank[0]:
        if key in ("policy/grad_norm", "policy/lr"):
            out[key] = per_rank[0][key]
        elif key == "policy/loss":
            out[key] = sum(m[key] * sum(s.grad_scales) / len(s.grad_scales) / world for m, s in pairs)
        else:
            out[key] = sum(m.get(key, 0.0) * s.num_tokens for m, s in pairs) / total
    return out
