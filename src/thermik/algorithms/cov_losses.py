"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning LMs").

Entropy collapses because the policy-gradient step lowers entropy in proportion to the covariance
between a token's log-probability and its advantage. Both losses find the few mask tokens with the
largest centred covariance cov_t = (A_t - mean A) * (logp_t - mean logp) (means over the mask tokens
of the tensor passed in) and restrain only those: Clip-Cov removes their gradient, KL-Cov adds a KL
penalty on them. Same signature and metrics as `thermik.algorithms.losses`.

Deviation: the paper draws Clip-Cov's tokens at random among those with cov in (lb, ub); here the
highest-covariance ones in that band are taken, which is deterministic. The covariance is computed over
the tensor passed in, i.e. one micro-batch: the selection (not the normaliser) depends on the split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thermik.algorithms.losses import Reduction, check_loss_inputs, log_ratio, ratio_metrics


@dataclass(frozen=True)
class ClipCovParams:
    """Clip-Cov: PPO's clip, and the gradient cut from the `fraction` of tokens of largest covariance in
    (cov_low, cov_high)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    fraction: float = 2e-4
    cov_low: float = 1.0
    cov_high: float = 5.0


@dataclass(frozen=True)
class KlCovParams:
    """KL-Cov: coef * |logp - old_logp| on the `fraction` of tokens of largest covariance."""

    fraction: float = 2e-4
    coef: float = 1.0


def token_covariance(logp: Tensor, adv: Tensor, keep: Tensor) -> Tensor:
    """(A - mean A) * (logp - mean logp) over mask tokens, detached; -inf off the mask. [N, T] -> [N, T]."""
    with torch.no_grad():
        n = keep.sum().clamp(min=1)
        a_mean = torch.where(keep, adv, torch.zeros_like(adv)).sum() / n
        l_mean = torch.where(keep, logp, torch.zeros_like(logp)).sum() / n
        cov = (adv - a_mean) * (logp.detach() - l_mean)
        return torch.where(keep, cov, torch.full_like(cov, -torch.inf))


def top_fraction(score: Tensor, eligible: Tensor, fraction: float, n_tokens: int) -> Tensor:
    """Boolean [N, T]: the max(1, int(fraction * n_tokens)) eligible positions with the largest score."""
    k = min(max(1, int(fraction * n_tokens)), int(eligible.sum().item()))
    chosen = torch.zeros_like(eligible)
    if k > 0:
        flat = torch.where(eligible, score, torch.full_like(score, -torch.inf)).flatten()
        chosen.view(-1)[torch.topk(flat, k).indices] = True
    return chosen


def clip_cov_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: ClipCovParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov: the PPO clipped loss, with the gradient removed from the max(1, fraction * n) tokens of
    largest covariance among those not already clipped and with cov_low < cov < cov_high.
    Extra metric: policy/cov_clip_frac.
    """
    keep = check_loss_inputs("clip_cov_loss", logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    clipped = ratio.clamp(1.0 - params.clip_low, 1.0 + params.clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    ppo_cut = ((adv > 0) & (ratio > 1.0 + params.clip_high)) | ((adv < 0) & (ratio < 1.0 - params.clip_low))
    cov = token_covariance(logp, adv, keep)
    band = keep & ~ppo_cut & (cov > params.cov_low) & (cov < params.cov_high)
    chosen = top_fraction(cov, band, params.fraction, int(keep.sum().item()))
    per_token = torch.where(chosen, per_token.detach(), per_token)
    return reduce(per_token, mask), ratio_metrics(ratio, keep, ppo_cut | chosen, cov_clip_frac=chosen)


def kl_cov_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: KlCovParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov: per token -ratio * A, plus coef * |logp - old_logp| on the max(1, fraction * n)
    mask tokens of largest covariance. No ratio clip. Extra metric: policy/kl_cov_frac.
    """
    keep = check_loss_inputs("kl_cov_loss", logp, old_logp, adv, mask)
    diff = log_ratio(logp, old_logp, keep)
    ratio = torch.exp(diff)
    cov = token_covariance(logp, adv, keep)
    chosen = top_fraction(cov, keep, params.fraction, int(keep.sum().item()))
    per_token = -ratio * adv + torch.where(chosen, params.coef * diff.abs(), torch.zeros_like(diff))
    return reduce(per_token, mask), ratio_metrics(ratio, keep, torch.zeros_like(keep), kl_cov_frac=chosen)
