"""Batch and reward shaping: which samples train, and reward terms that depend on length.

Pure functions of rewards, group ids and lengths; the trainer applies them to its trajectories.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thermik.algorithms.advantages import _group_index, group_stats


def zero_variance_rows(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """[N] bool: True for samples whose group's rewards are all equal (incl. singletons): no group signal."""
    index, num_groups = _group_index(rewards, group_ids)
    if num_groups == 0:
        return torch.zeros_like(rewards, dtype=torch.bool)
    return group_stats(rewards, index, num_groups).flat[index]


def select_groups(rewards: Tensor, group_ids: Tensor, target_groups: int, mode: str) -> list[tuple[int, int]]:
    """DAPO dynamic sampling (Yu et al. 2025, "DAPO"): which samples form the training batch.

    Drops groups whose rewards are all equal, keeps the others in order of first appearance, at most
    `target_groups` of them. mode "filter": only those (the caller samples more rounds until enough);
    mode "replace": fill the missing groups with copies of the kept ones (cycled), so the batch always has
    `target_groups` groups (none when no group has signal). Returns (row index, new group id) pairs; copies
    get fresh group ids 0..G-1 so no two groups merge.
    """
    if mode not in ("filter", "replace"):
        raise ValueError(f"dynamic sampling mode must be 'filter' or 'replace', got {mode!r}")
    if target_groups < 1:
        raise ValueError(f"target_groups must be >= 1, got {target_groups}")
    flat = zero_variance_rows(rewards, group_ids)
    order: list[int] = []
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        if flat[i]:
            continue
        if g not in rows:
            order.append(g)
            rows[g] = []
        rows[g].append(i)
    kept = order[:target_groups]
    if mode == "replace" and kept:
        kept = [kept[k % len(kept)] for k in range(target_groups)]
    return [(i, new_id) for new_id, g in enumerate(kept) for i in rows[g]]


def overlong_penalty(lengths: Tensor, max_length: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025), a reward term per sample. lengths [N] -> [N].

    0 for length <= max_length - buffer; -factor * (length - (max_length - buffer)) / buffer inside the
    last `buffer` tokens (linear from 0 to -factor); -factor beyond max_length.
    """
    if buffer <= 0 or buffer > max_length:
        raise ValueError(f"overlong_penalty: need 0 < buffer <= max_length; got buffer={buffer}, max={max_length}")
    over = (lengths.to(torch.float32) - (max_length - buffer)).clamp(min=0, max=buffer)
    return -factor * over / buffer


def length_penalty(rewards: Tensor, group_ids: Tensor, lengths: Tensor, coef: float) -> Tensor:
    """Kimi k1.5 length reward (Kimi Team 2025), a reward term per sample. [N] -> [N].

    Within a group, lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len) (0 when all lengths are equal);
    a correct sample (reward > 0) gets coef * lambda_i, an incorrect one coef * min(0, lambda_i): shorter
    correct answers are preferred and long wrong ones penalised.
    """
    index, num_groups = _group_index(rewards, group_ids)
    if num_groups == 0:
        return torch.zeros_like(rewards)
    lens = lengths.to(rewards.dtype)
    zeros = torch.zeros(num_groups, dtype=rewards.dtype)
    hi = zeros.scatter_reduce(0, index, lens, reduce="amax", include_self=False)[index]
    lo = zeros.scatter_reduce(0, index, lens, reduce="amin", include_self=False)[index]
    lam = torch.where(hi > lo, 0.5 - (lens - lo) / (hi - lo).clamp(min=1e-12), torch.zeros_like(lens))
    return coef * torch.where(rewards > 0, lam, lam.clamp(max=0))
