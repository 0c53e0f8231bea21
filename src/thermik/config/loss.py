"""`[algorithm.loss]`: the policy loss, one variant per loss with only its own knobs (docs/algorithms.md).

The defaults equal those of the loss's parameters type beside it in `thermik.algorithms` (a test checks);
`thermik.training.loss.loss_params` turns a variant into that type.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from thermik.config.base import Section
from thermik.config.variants import variants


class PPOLoss(Section):
    """Clipped surrogate (PPO) with asymmetric bounds (clip-higher)."""

    type: Literal["ppo"] = "ppo"
    clip_low: float = Field(0.2, ge=0, lt=1, description="Lower clip epsilon: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="Upper clip epsilon: ratio <= 1 + clip_high.")


class DualClipLoss(PPOLoss):
    """PPO with a second bound for negative advantages."""

    type: Literal["dual_clip"] = "dual_clip"  # type: ignore[assignment]
    clip_ratio_c: float = Field(3.0, gt=1, description="Dual-clip bound c: a token with A < 0 costs at most c|A|.")


class GSPOLoss(Section):
    """GSPO: clipped surrogate on the sequence ratio."""

    type: Literal["gspo"] = "gspo"
    clip_low: float = Field(3e-4, ge=0, lt=1, description="Lower clip on the sequence ratio.")
    clip_high: float = Field(4e-4, ge=0, description="Upper clip on the sequence ratio.")


class CISPOLoss(Section):
    """CISPO: clipped importance weight, every token keeps a gradient."""

    type: Literal["cispo"] = "cispo"
    clip_low: float = Field(1.0, ge=0, le=1, description="Weight >= 1 - clip_low (1 disables the bound).")
    clip_high: float = Field(4.0, ge=0, description="Weight <= 1 + clip_high.")


class SAPOLoss(Section):
    """SAPO: a smooth gate instead of the clip."""

    type: Literal["sapo"] = "sapo"
    tau_pos: float = Field(1.0, gt=0, description="Gate temperature for tokens with A > 0.")
    tau_neg: float = Field(1.05, gt=0, description="Gate temperature for tokens with A <= 0.")


class ClipCovLoss(PPOLoss):
    """Clip-Cov: PPO, with the gradient cut from the tokens of largest covariance."""

    type: Literal["clip_cov"] = "clip_cov"  # type: ignore[assignment]
    fraction: float = Field(2e-4, ge=0, le=1, description="Share of tokens whose gradient is cut.")
    cov_low: float = Field(1.0, description="Lower covariance bound of eligible tokens.")
    cov_high: float = Field(5.0, description="Upper covariance bound of eligible tokens.")


class KLCovLoss(Section):
    """KL-Cov: a KL penalty on the tokens of largest covariance."""

    type: Literal["kl_cov"] = "kl_cov"
    fraction: float = Field(2e-4, ge=0, le=1, description="Share of tokens that get the KL penalty.")
    coef: float = Field(1.0, ge=0, description="Weight of |logp - old_logp| on those tokens.")


class DPPOLoss(Section):
    """DPPO-Binary-TV: a trust region on the sampled token's probability."""

    type: Literal["dppo"] = "dppo"
    delta_low: float = Field(0.2, gt=0, description="Bound on a probability (TV) or KL drop, A < 0.")
    delta_high: float = Field(0.2, gt=0, description="Bound on a probability (TV) or KL rise, A > 0.")


class DPPOKLLoss(DPPOLoss):
    """DPPO-Binary-KL: as dppo, with the binary KL of the sampled token's probability."""

    type: Literal["dppo_kl"] = "dppo_kl"  # type: ignore[assignment]


class IPOLoss(Section):
    """Importance-ratio-capped policy objective."""

    type: Literal["ipo"] = "ipo"
    ratio_cap: float = Field(2.0, gt=0, description="Importance-ratio cap.")


class AIPOLoss(IPOLoss):
    """AIPO: off-policy REINFORCE with a truncated, stop-gradient importance weight."""

    type: Literal["aipo"] = "aipo"  # type: ignore[assignment]


class ImportanceSamplingLoss(Section):
    """REINFORCE with an importance ratio and no clip."""

    type: Literal["importance_sampling"] = "importance_sampling"


class CrossEntropyLoss(Section):
    """Supervised negative log-likelihood on the mask tokens."""

    type: Literal["cross_entropy"] = "cross_entropy"


class CustomLoss(Section):
    """A user's loss function, loaded from an import path."""

    type: Literal["custom"] = "custom"
    path: str = Field(..., min_length=1, description="Import path 'pkg.module:function' of the loss.")
    options: dict[str, float] = Field(default_factory=dict, description="Numbers the loss reads from params.options.")


LossConfig = variants(
    PPOLoss,
    DualClipLoss,
    GSPOLoss,
    CISPOLoss,
    SAPOLoss,
    ClipCovLoss,
    KLCovLoss,
    DPPOLoss,
    DPPOKLLoss,
    IPOLoss,
    AIPOLoss,
    ImportanceSamplingLoss,
    CrossEntropyLoss,
    CustomLoss,
)
"""`algorithm.loss`: one of the variants above, picked by `type` (default ppo)."""
