"""Policy-gradient losses of the clipped-ratio family, their shared signature, and per-token statistics.

Every policy loss has the signature `(logp, old_logp, adv, mask, params, reduce) -> (loss, metrics)`:
logp [N, T] (with gradient), old_logp [N, T] (behaviour policy, no gradient), adv [N, T], mask [N, T],
`params` a `LossParams` (the loss hyper-parameters, all of them, each loss reads its own), `reduce` maps
(per-token loss [N, T], mask) to the scalar (see `thermik.algorithms.reductions`). Metrics always hold
policy/clip_frac (mask tokens whose gradient the loss cuts or caps), policy/ratio_mean and
policy/ratio_std (population std) of ratio = exp(logp - old_logp) over mask tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

Reduction = Callable[[Tensor, Tensor], Tensor]
"""Maps (per-token values [N, T], mask [N, T]) to the scalar loss; see `thermik.algorithms.reductions`."""

# exp(20) ~ 5e8: a log-ratio beyond this is numerically meaningless and would overflow in fp16/bf16.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossParams:
    """Hyper-parameters of all policy losses; field names equal the `AlgorithmConfig` fields."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float = 3.0
    gspo_clip_low: float = 3e-4
    gspo_clip_high: float = 4e-4
    cispo_clip_low: float = 1.0
    cispo_clip_high: float = 4.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    dppo_delta_low: float = 0.2
    dppo_delta_high: float = 0.2
    ratio_cap: float = 2.0
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 1.0


def check_loss_inputs(name: str, logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """Validate the four [N, T] inputs; return the boolean mask."""
    if not (logp.shape == old_logp.shape == adv.shape == mask.shape) or logp.dim() != 2:
        shapes = [tuple(t.shape) for t in (logp, old_logp, adv, mask)]
        raise ValueError(f"{name}: logp, old_logp, adv, mask must all be [N, T]; got {shapes}")
    return mask.bool()


def log_ratio(logp: Tensor, old_logp: Tensor, keep: Tensor) -> Tensor:
    """logp - old_logp on mask tokens (old_logp detached), 0 off the mask, clamped to +-MAX_LOG_RATIO.

    Off-mask positions may hold padding garbage: zeroing them keeps exp() from making inf * 0 = NaN.
    """
    diff = torch.where(keep, logp - old_logp.detach(), torch.zeros_like(logp))
    return diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def masked_mean_std(x: Tensor, keep: Tensor) -> tuple[float, float]:
    if int(keep.sum().item()) == 0:
        return 0.0, 0.0
    vals = x[keep].detach().float()
    return vals.mean().item(), vals.std(unbiased=False).item()


def ratio_metrics(ratio: Tensor, keep: Tensor, cut: Tensor, **fractions: Tensor) -> dict[str, float]:
    """policy/clip_frac = share of mask tokens in `cut`, ratio mean/std, and policy/<name> for each extra mask."""
    with torch.no_grad():
        n = max(int(keep.sum().item()), 1)
        mean, std = masked_mean_std(ratio, keep)
        out = {"policy/clip_frac": (cut & keep).sum().item() / n, "policy/ratio_mean": mean, "policy/ratio_std": std}
        out.update({f"policy/{k}": (v & keep).sum().item() / n for k, v in fractions.items()})
    return out


def _clipped_surrogate(ratio: Tensor, adv: Tensor, low: float, high: float) -> Tensor:
    return -torch.minimum(ratio * adv, ratio.clamp(1.0 - low, 1.0 + high) * adv)


def _check_clip(name: str, low: float, high: float) -> None:
    if low < 0 or high < 0 or low >= 1:
        raise ValueError(f"{name}: need 0 <= clip_low < 1 and clip_high >= 0; got {low}, {high}")


def ppo_clip_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: LossParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate (PPO, Schulman et al. 2017) with asymmetric bounds ("clip-higher", DAPO, Yu et al. 2025).

    ratio = exp(logp - old_logp); per token -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A).
    Extra metrics: clip_frac_low / clip_frac_high (the two sides of policy/clip_frac).
    """
    keep = check_loss_inputs("ppo_clip_loss", logp, old_logp, adv, mask)
    _check_clip("ppo_clip_loss", params.clip_low, params.clip_high)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    loss = reduce(_clipped_surrogate(ratio, adv, params.clip_low, params.clip_high), mask)
    high = (adv > 0) & (ratio > 1.0 + params.clip_high)
    low = (adv < 0) & (ratio < 1.0 - params.clip_low)
    return loss, ratio_metrics(ratio, keep, high | low, clip_frac_high=high, clip_frac_low=low)


def dual_clip_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: LossParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL").

    The PPO per-token loss L, and for A < 0 additionally min(L, -clip_ratio_c * A): a negative-advantage
    token with a huge ratio contributes at most c * |A| (c > 1). Extra metric: clip_frac_dual.
    """
    keep = check_loss_inputs("dual_clip_loss", logp, old_logp, adv, mask)
    _check_clip("dual_clip_loss", params.clip_low, params.clip_high)
    if params.clip_ratio_c <= 1.0:
        raise ValueError(f"dual_clip_loss: clip_ratio_c must be > 1, got {params.clip_ratio_c}")
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    ppo = _clipped_surrogate(ratio, adv, params.clip_low, params.clip_high)
    bound = -params.clip_ratio_c * adv
    per_token = torch.where(adv < 0, torch.minimum(ppo, bound), ppo)
    dual = (adv < 0) & (ppo > bound)
    ppo_cut = ((adv > 0) & (ratio > 1.0 + params.clip_high)) | ((adv < 0) & (ratio < 1.0 - params.clip_low))
    return reduce(per_token, mask), ratio_metrics(ratio, keep, ppo_cut | dual, clip_frac_dual=dual)


def gspo_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: LossParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token (Zheng et al. 2025, "Group Sequence Policy Optimization"), sequence-level ratio.

    s_i = exp(mean over mask tokens of (logp - old_logp)) (the geometric mean of the token ratios);
    per token s_it = sg(s_i) * exp(logp - sg(logp)) (value s_i, gradient of logp_t scaled by s_i), then the
    clipped surrogate with gspo_clip_low/high (much tighter than PPO's: ~3e-4/4e-4). The paper uses
    sequence_mean. policy/ratio_* describe s_i per token.
    """
    keep = check_loss_inputs("gspo_loss", logp, old_logp, adv, mask)
    _check_clip("gspo_loss", params.gspo_clip_low, params.gspo_clip_high)
    diff = log_ratio(logp, old_logp, keep)
    seq_log = diff.sum(dim=-1, keepdim=True) / keep.sum(dim=-1, keepdim=True).clamp(min=1)
    token_log = torch.where(keep, logp - logp.detach(), torch.zeros_like(logp)) + seq_log.detach()
    ratio = torch.exp(token_log.clamp(max=MAX_LOG_RATIO))
    per_token = _clipped_surrogate(ratio, adv, params.gspo_clip_low, params.gspo_clip_high)
    cut = ((adv > 0) & (ratio > 1.0 + params.gspo_clip_high)) | ((adv < 0) & (ratio < 1.0 - params.gspo_clip_low))
    return reduce(per_token, mask), ratio_metrics(ratio, keep, cut)


def sapo_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: LossParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """SAPO, soft adaptive policy optimisation (Gao et al. 2025, Qwen, arXiv 2511.20347).

    A smooth gate replaces the hard clip: per token -f(r) * A with f(r) = (4 / tau) * sigmoid(tau * (r - 1)),
    tau = sapo_tau_pos where A > 0 else sapo_tau_neg. f(1) = 2 / tau and f'(1) = 1 (on-policy it is the plain
    policy gradient); the gradient decays smoothly as r leaves 1. No token is cut: clip_frac is 0.
    """
    keep = check_loss_inputs("sapo_loss", logp, old_logp, adv, mask)
    if params.sapo_tau_pos <= 0 or params.sapo_tau_neg <= 0:
        raise ValueError(f"sapo_loss: temperatures must be > 0; got {params.sapo_tau_pos}, {params.sapo_tau_neg}")
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    tau = torch.where(adv > 0, params.sapo_tau_pos, params.sapo_tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return reduce(-gate * adv, mask), ratio_metrics(ratio, keep, torch.zeros_like(keep))


def _dppo_loss(ratio: Tensor, adv: Tensor, mask: Tensor, blocked: Tensor, reduce: Reduction) -> Tensor:
    return reduce(torch.where(blocked, torch.zeros_like(ratio), -ratio * adv), mask)


def dppo_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: LossParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM RL", arXiv 2602.04879).

    The trust region is on the probability difference d = p - p_old (p = exp(logp)) of the sampled token,
    not on the ratio: per token -ratio * A, except 0 (no gradient) where A > 0 and d > dppo_delta_high or
    A < 0 and -d > dppo_delta_low. A rare token can move a lot in ratio and little in probability.
    """
    keep = check_loss_inputs("dppo_loss", logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    with torch.no_grad():
        d = torch.where(keep, logp.exp() - old_logp.exp(), torch.zeros_like(logp))
        blocked = ((adv > 0) & (d > params.dppo_delta_high)) | ((adv < 0) & (-d > params.dppo_delta_low))
    return _dppo_loss(ratio, adv, mask, blocked, reduce), ratio_metrics(ratio, keep, blocked)


def dppo_kl_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, params: LossParams, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """DPPO-Binary-KL (Qi et al. 2026): as `dppo_loss`, with the binary KL of the sampled token's probability.

    KL_b = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)); blocked where A > 0, p > p_old and
    KL_b > dppo_delta_high, or A < 0, p < p_old and KL_b > dppo_delta_low.
    """
    keep = check_loss_inputs("dppo_kl_loss", logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio(logp, old_logp, keep))
    with torch.no_grad():
        lp = torch.where(keep, logp, torch.zeros_like(logp)).clamp(max=0)
        lo = torch.where(keep, old_logp, torch.zeros_like(logp)).clamp(max=0)
        p, q = lp.exp(), lo.exp()
        tiny = 1e-8
        kl = q * (lo - lp) + (1 - q) * (torch.log(1 - q + tiny) - torch.log(1 - p + tiny))
        blocked = ((adv > 0) & (p > q) & (kl > params.dppo_delta_high)) | (
            (adv < 0) & (p < q) & (kl > params.dppo_delta_low)
        )
    return _dppo_loss(ratio, adv, mask, blocked, reduce), ratio_metrics(ratio, keep, blocked)


def entropy_from_logprobs(logp_all: Tensor) -> Tensor:
    """Entropy at each position from full log-probabilities [..., V]: H = -sum(p * log p)."""
    return -(logp_all.exp() * logp_all).sum(dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position: logits [N, T, V] -> [N, T].

    H = logsumexp(z) - sum(softmax(z) * z), computed in float32 for half-precision inputs.
    """
    if logits.dim() != 3:
        raise ValueError(f"entropy_from_logits: expected logits [N, T, V], got {tuple(logits.shape)}")
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
