"""Importance-weighted policy-gradient losses (REINFORCE with a ratio) and the SFT cross-entropy.

Same signature and metrics as `thermik.algorithms.losses`. "sg" is stop-gradient (detach): a loss of the
form -sg(w) * A * logp has gradient -w * A * grad(logp), a weighted REINFORCE step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thermik.algorithms.losses import NoParams, Reduction, check_loss_inputs, log_ratio, ratio_metrics


@dataclass(frozen=True)
class CispoParams:
    """CISPO: the importance weight clipped to [1 - clip_low, 1 + clip_high] (clip_low = 1: no lower bound)."""

    clip_low: float = 1.0
    clip_high: float = 4.0


@dataclass(frozen=True)
class RatioCapParams:
    """ipo and aipo: the importance ratio capped at ratio_cap."""

    ratio_cap: float = 2.0


def cispo_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: CispoParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, MiniMax 2025, "Scaling Test-Time Compute Efficiently with Lightning Attention").

    Clip the importance-sampling weight, not the update: per token
    -sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * A * logp. Every token keeps a gradient;
    the weight is capped. clip_frac counts tokens whose weight hit a bound.
    """
    keep = check_loss_inputs("cispo_loss", logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    low, high = 1.0 - params.clip_low, 1.0 + params.clip_high
    weight = ratio.clamp(low, high).detach()
    per_token = -weight * adv * torch.where(keep, logp, torch.zeros_like(logp))
    return reduce(per_token, mask), ratio_metrics(ratio, keep, (ratio < low) | (ratio > high))


def _check_cap(name: str, cap: float) -> None:
    if cap <= 0:
        raise ValueError(f"{name}: ratio_cap must be > 0, got {cap}")


def ipo_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: RatioCapParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """Importance-ratio-capped policy objective: per token -min(ratio, ratio_cap) * A.

    Truncated importance sampling applied inside the surrogate (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"): below the cap the gradient is the full
    importance-weighted one, above it the token contributes no gradient (as a one-sided PPO clip that
    also applies to negative advantages). clip_frac counts capped tokens. See docs/algorithms.md for
    how this name relates to `aipo`.
    """
    keep = check_loss_inputs("ipo_loss", logp, old_logp, adv, mask)
    _check_cap("ipo_loss", params.ratio_cap)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    per_token = -ratio.clamp(max=params.ratio_cap) * adv
    return reduce(per_token, mask), ratio_metrics(ratio, keep, ratio > params.ratio_cap)


def aipo_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: RatioCapParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """AIPO, asynchronous importance-weighted policy optimisation (LlamaRL, Meta 2025, arXiv 2505.24034).

    Off-policy REINFORCE with a truncated, stop-gradient importance weight: per token
    -sg(min(ratio, ratio_cap)) * A * logp. Unlike `ipo`, a capped token still gets a (bounded) gradient.
    clip_frac counts capped tokens.
    """
    keep = check_loss_inputs("aipo_loss", logp, old_logp, adv, mask)
    _check_cap("aipo_loss", params.ratio_cap)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    weight = ratio.clamp(max=params.ratio_cap).detach()
    per_token = -weight * adv * torch.where(keep, logp, torch.zeros_like(logp))
    return reduce(per_token, mask), ratio_metrics(ratio, keep, ratio > params.ratio_cap)


def importance_sampling_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: NoParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE with an importance ratio and no clip (Williams 1992; the Tinker "importance_sampling" loss).

    Per token -ratio * A, ratio = exp(logp - old_logp); its gradient is -ratio * A * grad(logp), unbiased
    for samples drawn from the behaviour policy.
    """
    keep = check_loss_inputs("importance_sampling_loss", logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    return reduce(-ratio * adv, mask), ratio_metrics(ratio, keep, torch.zeros_like(keep))


def cross_entropy_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: NoParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """Supervised negative log-likelihood on mask tokens: per token -logp (advantages and ratio are ignored).

    For SFT-style updates on chosen samples (e.g. only positive ones) through the RL trainer.
    """
    keep = check_loss_inputs("cross_entropy_loss", logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    per_token = -torch.where(keep, logp, torch.zeros_like(logp))
    return reduce(per_token, mask), ratio_metrics(ratio, keep, torch.zeros_like(keep))


def dro_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, beta: float, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """DRO, direct reward optimisation with a quadratic penalty (Richemond et al. 2024, "Offline Regularised
    Reinforcement Learning for Large Language Models Alignment"; the Tinker "dro" loss).

    Per token -(A * logp - beta / 2 * (logp - old_logp)^2): a REINFORCE term and a squared log-ratio that keeps
    the policy near the behaviour policy. Takes `beta` instead of a params dataclass (it is not a policy-loss table
    entry). clip_frac is 0.
    """
    if beta < 0:
        raise ValueError(f"dro_loss: beta must be >= 0, got {beta}")
    keep = check_loss_inputs("dro_loss", logp, old_logp, adv, mask)
    diff = log_ratio(logp, old_logp, keep)
    per_token = -(adv * torch.where(keep, logp, torch.zeros_like(logp)) - 0.5 * beta * diff.square())
    return reduce(per_token, mask), ratio_metrics(torch.exp(diff), keep, torch.zeros_like(keep))
