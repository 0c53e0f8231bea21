"""Group-relative advantage estimators: one scalar advantage per sequence.

All estimators share the signature `(rewards [N], group_ids [N] int, std_eps) -> (adv [N], metrics)`.
A group is the set of samples drawn for one prompt. Groups whose rewards are all equal (including
singleton groups) carry no learning signal and get exactly 0, rather than rounding noise divided
by `std_eps`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _group_index(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, int]:
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"expected rewards [N] and group_ids [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    if not rewards.dtype.is_floating_point:
        raise ValueError(f"rewards must be a floating-point tensor, got {rewards.dtype}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, int(index.max().item()) + 1 if index.numel() else 0


def _group_stats(rewards: Tensor, index: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group mean, population std (divide by n) and an 'all rewards equal' flag, each [G]."""
    zeros = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    count = zeros.index_add(0, index, torch.ones_like(rewards))
    mean = zeros.index_add(0, index, rewards) / count
    var = zeros.index_add(0, index, (rewards - mean[index]) ** 2) / count
    hi = zeros.scatter_reduce(0, index, rewards, reduce="amax", include_self=False)
    lo = zeros.scatter_reduce(0, index, rewards, reduce="amin", include_self=False)
    return mean, var.sqrt(), hi == lo


def _metrics(adv: Tensor, flat: Tensor, num_groups: int) -> dict[str, float]:
    return {
        "advantage/mean": adv.mean().item() if adv.numel() else 0.0,
        "advantage/abs_mean": adv.abs().mean().item() if adv.numel() else 0.0,
        "advantage/zero_std_frac": flat.float().mean().item() if num_groups else 0.0,
        "advantage/num_groups": float(num_groups),
    }


def grpo_advantages(rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean_g) / (std_g + std_eps).

    rewards [N] float, group_ids [N] int (any values; equal ids form a group) -> adv [N].
    std_g is the population std (unbiased=False, divide by the group size), so a group's
    advantages have unit variance up to eps. Groups with all-equal rewards (and singletons) get 0.
    """
    index, num_groups = _group_index(rewards, group_ids)
    if num_groups == 0:
        return torch.zeros_like(rewards), _metrics(rewards, torch.zeros(0, dtype=torch.bool), 0)
    mean, std, flat = _group_stats(rewards, index, num_groups)
    adv = (rewards - mean[index]) / (std[index] + std_eps)
    adv = torch.where(flat[index], torch.zeros_like(adv), adv)
    return adv, _metrics(adv, flat, num_groups)


def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_g.

    Same shapes as `grpo_advantages`; no division by the group std (removes the question-level
    difficulty bias). `std_eps` is accepted so all estimators share one signature, and unused.
    """
    del std_eps
    index, num_groups = _group_index(rewards, group_ids)
    if num_groups == 0:
        return torch.zeros_like(rewards), _metrics(rewards, torch.zeros(0, dtype=torch.bool), 0)
    mean, _, flat = _group_stats(rewards, index, num_groups)
    adv = torch.where(flat[index], torch.zeros_like(rewards), rewards - mean[index])
    return adv, _metrics(adv, flat, num_groups)


def broadcast_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """Give every mask token of sequence i the advantage adv[i]: adv [N], mask [N, T] -> [N, T] (0 off-mask)."""
    if adv.dim() != 1 or mask.dim() != 2 or mask.shape[0] != adv.shape[0]:
        raise ValueError(f"expected adv [N] and mask [N, T]; got {tuple(adv.shape)} and {tuple(mask.shape)}")
    return adv[:, None] * mask.to(adv.dtype)
