"""Policy-gradient losses and per-token statistics of the policy."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Reduction = Callable[[Tensor, Tensor], Tensor]
"""Maps (per-token values [N, T], mask [N, T]) to the scalar loss; see `thermik.algorithms.reductions`."""

# exp(20) ~ 5e8: a log-ratio beyond this is numerically meaningless and would overflow in fp16/bf16.
MAX_LOG_RATIO = 20.0


def _masked_mean_std(x: Tensor, keep: Tensor) -> tuple[float, float]:
    n = int(keep.sum().item())
    if n == 0:
        return 0.0, 0.0
    vals = x[keep].detach().float()
    return vals.mean().item(), vals.std(unbiased=False).item()


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    reduce: Reduction,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate (PPO, Schulman et al. 2017) with asymmetric bounds ("clip-higher", DAPO, Yu et al. 2025).

    logp, old_logp, adv, mask: [N, T]. ratio = exp(logp - old_logp) and the per-token loss is
    -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), reduced by `reduce(loss, mask)`
    (e.g. `partial(token_mean, normalizer=tokens_in_minibatch)`). Returns (scalar loss, metrics).
    Metrics over mask tokens: policy/clip_frac (tokens whose gradient the clip zeroes; split into
    clip_frac_low / clip_frac_high), policy/ratio_mean, policy/ratio_std (population std).
    """
    if not (logp.shape == old_logp.shape == adv.shape == mask.shape) or logp.dim() != 2:
        shapes = [tuple(t.shape) for t in (logp, old_logp, adv, mask)]
        raise ValueError(f"ppo_clip_loss: logp, old_logp, adv, mask must all be [N, T]; got {shapes}")
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"ppo_clip_loss: need 0 <= clip_low < 1 and clip_high >= 0; got {clip_low}, {clip_high}")
    keep = mask.bool()
    # Off-mask positions may hold padding garbage: zero their log-ratio so exp() cannot make inf * 0 = NaN.
    log_ratio = torch.where(keep, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    loss = reduce(per_token, mask)

    with torch.no_grad():
        high = keep & (adv > 0) & (ratio > 1.0 + clip_high)
        low = keep & (adv < 0) & (ratio < 1.0 - clip_low)
        n = max(int(keep.sum().item()), 1)
        ratio_mean, ratio_std = _masked_mean_std(ratio, keep)
        metrics = {
            "policy/clip_frac": (high | low).sum().item() / n,
            "policy/clip_frac_high": high.sum().item() / n,
            "policy/clip_frac_low": low.sum().item() / n,
            "policy/ratio_mean": ratio_mean,
            "policy/ratio_std": ratio_std,
        }
    return loss, metrics


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position: logits [N, T, V] -> [N, T].

    H = logsumexp(z) - sum(softmax(z) * z), computed in float32 for half-precision inputs.
    """
    if logits.dim() != 3:
        raise ValueError(f"entropy_from_logits: expected logits [N, T, V], got {tuple(logits.shape)}")
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
