"""Off-policy correction between the rollout engine and the trainer, as a per-token loss weight.

The engine that sampled a batch and the trainer that scores it disagree (different kernels, precision,
or stale weights in async mode), so "on-policy" training is secretly off-policy (Yao et al. 2025, "Your
efficient RL framework secretly brings you off-policy RL training"). The importance ratio between the
trainer's behaviour logprobs and the rollout logprobs, rho = exp(old_logp - rollout_logp), corrects it:

- truncated IS (`tis`, Yao et al. 2025): weight = min(rho, cap);
- masked IS (`mis`, "IcePop", Ling team 2025; Liu et al. 2025 "When speed kills stability"):
  weight = rho where low <= rho <= high, else 0 (the token or sequence is dropped).

Level `token` uses each token's rho; level `sequence` gives every token of a sequence the sequence's
rho, in `product` form (exp of the summed log-ratio, the exact sequence IS ratio) or `geometric` form
(exp of the mean log-ratio, length-normalised). Weights carry no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from thermik.algorithms.losses import MAX_LOG_RATIO


@dataclass(frozen=True)
class OffPolicyParams:
    mode: str = "none"  # none | tis | mis
    level: str = "token"  # token | sequence
    form: str = "geometric"  # geometric | product (sequence level only)
    cap: float = 2.0  # tis
    low: float = 0.5  # mis
    high: float = 2.0  # mis


def _log_rho(old_logp: Tensor, rollout_logp: Tensor, keep: Tensor) -> Tensor:
    return torch.where(keep, old_logp.detach() - rollout_logp, torch.zeros_like(old_logp))


def token_ratio(old_logp: Tensor, rollout_logp: Tensor, keep: Tensor) -> Tensor:
    """rho_t = exp(old_logp - rollout_logp) on mask tokens, 1 elsewhere. [N, T]."""
    return torch.exp(_log_rho(old_logp, rollout_logp, keep).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def sequence_ratio_product(old_logp: Tensor, rollout_logp: Tensor, keep: Tensor) -> Tensor:
    """rho_i = prod_t rho_t = exp(sum_t log rho_t), repeated on every position of row i. [N, T]."""
    total = _log_rho(old_logp, rollout_logp, keep).sum(dim=-1, keepdim=True)
    return torch.exp(total.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)).expand_as(old_logp)


def sequence_ratio_geometric(old_logp: Tensor, rollout_logp: Tensor, keep: Tensor) -> Tensor:
    """rho_i = exp(mean over mask tokens of log rho_t), repeated on every position of row i. [N, T]."""
    total = _log_rho(old_logp, rollout_logp, keep).sum(dim=-1, keepdim=True)
    mean = total / keep.sum(dim=-1, keepdim=True).clamp(min=1)
    return torch.exp(mean.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)).expand_as(old_logp)


RATIOS: Mapping[tuple[str, str], Callable[[Tensor, Tensor, Tensor], Tensor]] = MappingProxyType(
    {
        ("token", "geometric"): token_ratio,
        ("token", "product"): token_ratio,
        ("sequence", "product"): sequence_ratio_product,
        ("sequence", "geometric"): sequence_ratio_geometric,
    }
)


def truncate(rho: Tensor, params: OffPolicyParams) -> tuple[Tensor, Tensor]:
    """TIS: (min(rho, cap), positions where the cap bit)."""
    if params.cap <= 0:
        raise ValueError(f"tis: cap must be > 0, got {params.cap}")
    return rho.clamp(max=params.cap), rho > params.cap


def mask_outside(rho: Tensor, params: OffPolicyParams) -> tuple[Tensor, Tensor]:
    """MIS: (rho inside [low, high] else 0, positions dropped)."""
    if not 0 <= params.low <= 1 <= params.high:
        raise ValueError(f"mis: need 0 <= low <= 1 <= high; got low={params.low}, high={params.high}")
    out = (rho < params.low) | (rho > params.high)
    return torch.where(out, torch.zeros_like(rho), rho), out


WEIGHTINGS: Mapping[str, Callable[[Tensor, OffPolicyParams], tuple[Tensor, Tensor]]] = MappingProxyType(
    {"tis": truncate, "mis": mask_outside}
)


def off_policy_weights(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, params: OffPolicyParams
) -> tuple[Tensor, dict[str, float]]:
    """Per-token loss weights [N, T] (0 off the mask) and metrics; all ones when params.mode == "none".

    Metrics over mask tokens: off_policy/weight_mean, off_policy/corrected_frac (share of tokens the cap
    bit (tis) or that were dropped (mis)), off_policy/mismatch_kl (k3 estimate of KL(rollout || trainer):
    rho - 1 - log rho, averaged).
    """
    if old_logp.shape != rollout_logp.shape or old_logp.shape != mask.shape or old_logp.dim() != 2:
        shapes = [tuple(t.shape) for t in (old_logp, rollout_logp, mask)]
        raise ValueError(f"off_policy_weights: old_logp, rollout_logp, mask must be [N, T]; got {shapes}")
    keep = mask.bool()
    with torch.no_grad():
        log_rho = _log_rho(old_logp, rollout_logp, keep).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        n = max(int(keep.sum().item()), 1)
        kl = float(torch.where(keep, log_rho.exp() - 1.0 - log_rho, torch.zeros_like(log_rho)).sum()) / n
        if params.mode == "none":
            return keep.to(old_logp.dtype), {"off_policy/mismatch_kl": kl}
        if params.mode not in WEIGHTINGS or (params.level, params.form) not in RATIOS:
            raise ValueError(
                f"off-policy correction {params.mode!r}/{params.level!r}/{params.form!r} unknown; "
                f"modes: none, {', '.join(sorted(WEIGHTINGS))}; levels: token, sequence; forms: geometric, product"
            )
        rho = RATIOS[(params.level, params.form)](old_logp, rollout_logp, keep)
        weight, corrected = WEIGHTINGS[params.mode](rho, params)
        weight = torch.where(keep, weight, torch.zeros_like(weight))
        metrics = {
            "off_policy/weight_mean": float(weight.sum()) / n,
            "off_policy/corrected_frac": float((corrected & keep).sum()) / n,
            "off_policy/mismatch_kl": kl,
        }
    return weight, metrics
