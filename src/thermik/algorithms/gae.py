"""Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE").

Token-level: the time axis is the sequence's *sampled* tokens (mask = 1); prompt, observation and
padding positions are skipped, so in a multi-turn episode the value bootstraps from the next sampled
token across an observation. The values come from a critic (a value head evaluated on the same
[N, T] layout as the logprobs); this module only does the arithmetic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thermik.algorithms.advantages import (
    NO_CONTEXT,
    AdvantageContext,
    _check_token_inputs,
    _group_index,
    _metrics,
    _token_rewards,
)


def gae_advantages_and_returns(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """delta_t = r_t + gamma V_{t+1} - V_t ; A_t = delta_t + gamma lam A_{t+1} ; returns R_t = A_t + V_t.

    token_rewards, values, mask: [N, T]; t+1 is the next mask token of the same row (V = 0 after the
    last one: the episode ends). Returns (A, R), both [N, T] and 0 off the mask. R is the critic's
    regression target; A is not normalised here.
    """
    _check_token_inputs(token_rewards, mask, "gae")
    if values.shape != mask.shape:
        raise ValueError(f"gae: values must be [N, T] like mask {tuple(mask.shape)}, got {tuple(values.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae: need 0 <= gamma <= 1 and 0 <= lam <= 1; got gamma={gamma}, lam={lam}")
    keep = mask.bool()
    values = torch.where(keep, values.detach(), torch.zeros_like(values))
    adv = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(mask.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(keep[:, t], a_t, torch.zeros_like(a_t))
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        next_adv = torch.where(keep[:, t], a_t, next_adv)
    return adv, torch.where(keep, adv + values, torch.zeros_like(adv))


def gae_advantages(
    rewards: Tensor, group_ids: Tensor, std_eps: float = 1e-6, *, ctx: AdvantageContext = NO_CONTEXT
) -> tuple[Tensor, dict[str, float]]:
    """GAE advantages whitened over the batch's mask tokens, as PPO implementations do: (A - mean) / (std + eps).

    Needs ctx.mask and ctx.values (critic values, [N, T]); token rewards from ctx.token_rewards or each
    sequence's reward on its last mask token; gamma, lam from ctx. -> adv [N, T].
    """
    if ctx.mask is None or ctx.values is None:
        raise ValueError(
            "the gae estimator needs critic values and the loss mask (AdvantageContext(values=..., mask=...)); "
            "configure a critic or choose an estimator without one (grpo, rloo, reinforce_pp, ...)"
        )
    _, num_groups = _group_index(rewards, group_ids)
    token_rewards = _token_rewards(rewards, ctx)
    assert token_rewards is not None  # ctx.mask is set
    adv, _ = gae_advantages_and_returns(token_rewards, ctx.values, ctx.mask, ctx.gamma, ctx.lam)
    keep = ctx.mask.bool()
    vals = adv[keep]
    if vals.numel() > 1 and vals.max() > vals.min():
        adv = torch.where(keep, (adv - vals.mean()) / (vals.std(unbiased=False) + std_eps), torch.zeros_like(adv))
    metrics = _metrics(adv, torch.zeros(num_groups, dtype=torch.bool), num_groups)
    return adv, metrics
