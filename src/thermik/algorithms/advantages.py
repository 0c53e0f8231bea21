"""Advantage estimators.

Every estimator has the signature `(rewards [N], group_ids [N] int, std_eps, *, ctx) -> (adv, metrics)`:
`rewards` is each sequence's return (the sum of its token rewards), `group_ids` marks the samples drawn for
one prompt, and `ctx` (an `AdvantageContext`) carries what only some estimators read: the loss mask, the
per-token rewards, critic values, response lengths, gamma and lambda. Outcome estimators return one
advantage per sequence, [N]; token-level ones (`reinforce_pp`, `gae` in `thermik.algorithms.gae`) return
[N, T]; `to_tokens` turns either into the [N, T] tensor the loss reads.

Groups whose rewards are all equal (including singleton groups) carry no learning signal and get
exactly 0, rather than rounding noise divided by `std_eps`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AdvantageContext:
    """Optional inputs, aligned with the training tensors: mask/token_rewards/values [N, T], lengths [N]."""

    mask: Tensor | None = None
    token_rewards: Tensor | None = None
    values: Tensor | None = None
    lengths: Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0


NO_CONTEXT = AdvantageContext()


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


@dataclass(frozen=True)
class GroupStats:
    """Per-group statistics, each [G]: size, mean, population std (divide by n), 'all rewards equal'."""

    count: Tensor
    mean: Tensor
    std: Tensor
    flat: Tensor


def group_stats(rewards: Tensor, index: Tensor, num_groups: int) -> GroupStats:
    zeros = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    count = zeros.index_add(0, index, torch.ones_like(rewards))
    mean = zeros.index_add(0, index, rewards) / count
    var = zeros.index_add(0, index, (rewards - mean[index]) ** 2) / count
    hi = zeros.scatter_reduce(0, index, rewards, reduce="amax", include_self=False)
    lo = zeros.scatter_reduce(0, index, rewards, reduce="amin", include_self=False)
    return GroupStats(count, mean, var.sqrt(), hi == lo)


def _metrics(adv: Tensor, flat: Tensor, num_groups: int) -> dict[str, float]:
    return {
        "advantage/mean": adv.mean().item() if adv.numel() else 0.0,
        "advantage/abs_mean": adv.abs().mean().item() if adv.numel() else 0.0,
        "advantage/zero_std_frac": flat.float().mean().item() if num_groups else 0.0,
        "advantage/num_groups": float(num_groups),
    }


def _grouped(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, GroupStats] | None:
    """(index [N], stats) or None for an empty batch."""
    index, num_groups = _group_index(rewards, group_ids)
    if num_groups == 0:
        return None
    return index, group_stats(rewards, index, num_groups)


def _zero_flat(adv: Tensor, index: Tensor, stats: GroupStats) -> tuple[Tensor, dict[str, float]]:
    adv = torch.where(stats.flat[index], torch.zeros_like(adv), adv)
    return adv, _metrics(adv, stats.flat, stats.count.numel())


def _empty(rewards: Tensor) -> tuple[Tensor, dict[str, float]]:
    return torch.zeros_like(rewards), _metrics(rewards, torch.zeros(0, dtype=torch.bool), 0)


def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean_g) / (std_g + std_eps).

    rewards [N] float, group_ids [N] int (any values; equal ids form a group) -> adv [N].
    std_g is the population std (unbiased=False, divide by the group size), so a group's
    advantages have unit variance up to eps. Groups with all-equal rewards (and singletons) get 0.
    """
    del ctx
    grouped = _grouped(rewards, group_ids)
    if grouped is None:
        return _empty(rewards)
    index, s = grouped
    return _zero_flat((rewards - s.mean[index]) / (s.std[index] + std_eps), index, s)


def dr_grpo_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_g.

    Same shapes as `grpo_advantages`; no division by the group std (removes the question-level
    difficulty bias). `std_eps` is accepted so all estimators share one signature, and unused.
    """
    del std_eps, ctx
    grouped = _grouped(rewards, group_ids)
    if grouped is None:
        return _empty(rewards)
    index, s = grouped
    return _zero_flat(rewards - s.mean[index], index, s)


def rloo_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """RLOO, leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j.

    Equivalently n/(n-1) * (r_i - mean_g) for a group of size n. Singletons (no other sample to form
    a baseline) and all-equal groups get 0. [N] -> [N].
    """
    del std_eps, ctx
    grouped = _grouped(rewards, group_ids)
    if grouped is None:
        return _empty(rewards)
    index, s = grouped
    n = s.count[index]
    return _zero_flat((rewards - s.mean[index]) * n / (n - 1).clamp(min=1), index, s)


def maxrl_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """MaxRL, mean-normalised advantage (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning").

    A_i = (r_i - mean_g) / (mean_g + std_eps). For 0/1 rewards mean_g estimates the pass rate p, and the
    1/p factor turns the policy gradient of p into that of log p (maximum likelihood of a correct answer),
    weighting hard prompts up. Groups with all-equal rewards (all wrong: mean 0) and singletons get 0.
    Rewards should be non-negative. [N] -> [N].
    """
    del ctx
    grouped = _grouped(rewards, group_ids)
    if grouped is None:
        return _empty(rewards)
    index, s = grouped
    return _zero_flat((rewards - s.mean[index]) / (s.mean[index] + std_eps), index, s)


def _lengths(ctx: AdvantageContext, n: int, name: str) -> Tensor:
    if ctx.lengths is not None:
        lengths = ctx.lengths
    elif ctx.mask is not None:
        lengths = ctx.mask.sum(dim=-1)
    else:
        raise ValueError(f"{name} needs response lengths: pass ctx=AdvantageContext(lengths=... or mask=...)")
    if lengths.shape != (n,):
        raise ValueError(f"{name}: lengths must be [N] = [{n}], got {tuple(lengths.shape)}")
    return lengths


def opo_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """OPO, optimal reward baseline (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline").

    A_i = r_i - b_g with the length-weighted baseline b_g = sum_j l_j r_j / sum_j l_j over the group,
    l_j = response length (ctx.lengths, or ctx.mask.sum(-1)). No std normalisation. All-equal groups
    and singletons get 0; a group whose lengths are all 0 falls back to the plain mean. [N] -> [N].
    """
    del std_eps
    grouped = _grouped(rewards, group_ids)
    if grouped is None:
        return _empty(rewards)
    index, s = grouped
    lengths = _lengths(ctx, rewards.numel(), "opo").to(rewards.dtype)
    zeros = torch.zeros_like(s.mean)
    weight = zeros.index_add(0, index, lengths)
    baseline = torch.where(weight > 0, zeros.index_add(0, index, lengths * rewards) / weight.clamp(min=1e-12), s.mean)
    return _zero_flat(rewards - baseline[index], index, s)


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = sum_{k >= t, mask_k = 1} gamma^(#mask tokens between t and k) r_k, on mask tokens; 0 elsewhere.

    token_rewards, mask [N, T]. Off-mask positions (prompt, observations, padding, a masked overlong
    sample) are skipped, rewards there included, so the discount counts sampled tokens only.
    """
    _check_token_inputs(token_rewards, mask, "discounted_returns")
    keep = mask.bool()
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(keep[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(keep[:, t], running, torch.zeros_like(running))
    return returns


def _check_token_inputs(token_rewards: Tensor, mask: Tensor, name: str) -> None:
    if token_rewards.dim() != 2 or token_rewards.shape != mask.shape:
        raise ValueError(
            f"{name}: token_rewards and mask must both be [N, T]; got {tuple(token_rewards.shape)}, {tuple(mask.shape)}"
        )


def _token_rewards(rewards: Tensor, ctx: AdvantageContext) -> Tensor | None:
    """ctx.token_rewards, or each sequence's reward on its last mask token; None without a mask."""
    if ctx.token_rewards is not None:
        return ctx.token_rewards
    if ctx.mask is None:
        return None
    keep = ctx.mask.bool()
    last = torch.where(keep, torch.arange(keep.shape[1], device=keep.device), -1).amax(dim=-1)
    out = torch.zeros(ctx.mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards[rows]
    return out


def _global_whiten(x: Tensor, keep: Tensor, std_eps: float, center: bool = True) -> Tensor:
    """(x - mean) / (std + eps) over the `keep` entries (population std), or x / (std + eps) when not
    `center`; 0 off `keep`, and 0 everywhere when all kept entries are equal (no signal)."""
    vals = x[keep]
    if vals.numel() == 0 or vals.max() == vals.min():
        return torch.zeros_like(x)
    shift = vals.mean() if center else 0.0
    return torch.where(keep, (x - shift) / (vals.std(unbiased=False) + std_eps), torch.zeros_like(x))


def reinforce_pp_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++ (Hu 2025, "REINFORCE++: a simple and efficient approach for aligning LLMs").

    Per-token returns G_t = sum_{k >= t} gamma^(k-t) r_k (`discounted_returns` over ctx.token_rewards,
    or the sequence reward on its last mask token), then global batch normalisation over all mask
    tokens: A_t = (G_t - mean) / (std + std_eps). No group baseline. With ctx.mask -> adv [N, T];
    without it each sequence counts as one token -> adv [N]. An all-equal batch gets 0.
    """
    index, num_groups = _group_index(rewards, group_ids)
    token_rewards = _token_rewards(rewards, ctx)
    if token_rewards is None or ctx.mask is None:
        adv = _global_whiten(rewards, torch.ones_like(rewards, dtype=torch.bool), std_eps)
    else:
        returns = discounted_returns(token_rewards, ctx.mask, ctx.gamma)
        adv = _global_whiten(returns, ctx.mask.bool(), std_eps)
    flat = group_stats(rewards, index, num_groups).flat if num_groups else torch.zeros(0, dtype=torch.bool)
    return adv, _metrics(adv, flat, num_groups)


def reinforce_pp_baseline_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++-baseline (Hu 2025): subtract the group mean, then divide by the batch std.

    a_i = r_i - mean_g (0 for all-equal groups and singletons); A = a / (std + std_eps) where std is the
    population std of a over all mask tokens of the batch (each sequence's a repeated on its tokens;
    over sequences when ctx.mask is None). Not re-centred. -> adv [N, T] with a mask, else [N].
    """
    centred, metrics = dr_grpo_advantages(rewards, group_ids)
    if ctx.mask is None:
        adv = _global_whiten(centred, torch.ones_like(centred, dtype=torch.bool), std_eps, center=False)
    else:
        adv = _global_whiten(to_tokens(centred, ctx.mask), ctx.mask.bool(), std_eps, center=False)
    return adv, {**metrics, "advantage/mean": adv.mean().item(), "advantage/abs_mean": adv.abs().mean().item()}


def broadcast_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """Give every mask token of sequence i the advantage adv[i]: adv [N], mask [N, T] -> [N, T] (0 off-mask)."""
    if adv.dim() != 1 or mask.dim() != 2 or mask.shape[0] != adv.shape[0]:
        raise ValueError(f"expected adv [N] and mask [N, T]; got {tuple(adv.shape)} and {tuple(mask.shape)}")
    return adv[:, None] * mask.to(adv.dtype)


def to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """[N] (one advantage per sequence) or [N, T] (per token) -> [N, T], 0 off the mask."""
    if adv.dim() == 2:
        if adv.shape != mask.shape:
            raise ValueError(f"token advantages {tuple(adv.shape)} do not match mask {tuple(mask.shape)}")
        return torch.where(mask.bool(), adv, torch.zeros_like(adv))
    return broadcast_to_tokens(adv, mask)
