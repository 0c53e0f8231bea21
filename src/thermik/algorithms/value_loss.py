"""The critic's clipped value loss (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", as in the
PPO reference implementation, OpenAI baselines `ppo2`).

    v_clip = old_v + clip(v - old_v, -value_clip, value_clip)
    loss_t = 0.5 * max((v - R)^2, (v_clip - R)^2)

`old_v` are the values the critic gave the batch before this update (they also fed GAE), `R` the GAE returns.
The max keeps the pessimistic branch, so one update cannot move a value more than `value_clip` away from its
old estimate to gain loss. value_clip = 0 disables clipping (plain squared error).
"""

from __future__ import annotations

import torch
from torch import Tensor

from thermik.algorithms.losses import Reduction


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, value_clip: float, reduce: Reduction
) -> tuple[Tensor, dict[str, float]]:
    """values, old_values, returns, mask: [N, T]; reduce: the reduction of the per-token loss (token_mean with the
    mini-batch's token count). Returns (loss, metrics): `critic/clip_frac` is the share of mask tokens whose
    clipped branch is the larger one (its gradient is cut), `critic/value_mean`, `critic/return_mean`."""
    if not (values.shape == old_values.shape == returns.shape == mask.shape):
        shapes = [tuple(t.shape) for t in (values, old_values, returns, mask)]
        raise ValueError(f"clipped_value_loss: values, old_values, returns and mask must share a shape; got {shapes}")
    if value_clip < 0:
        raise ValueError(f"clipped_value_loss: value_clip must be >= 0 (0 disables clipping), got {value_clip}")
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns) ** 2
    if value_clip == 0:
        per_token, cut = 0.5 * unclipped, torch.zeros_like(mask, dtype=torch.bool)
    else:
        v_clip = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = (v_clip - returns) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        cut = clipped > unclipped
    keep = mask.bool()
    n = max(int(keep.sum()), 1)
    metrics = {
        "critic/clip_frac": float((cut & keep).sum()) / n,
        "critic/value_mean": float(values.detach()[keep].sum()) / n,
        "critic/return_mean": float(returns[keep].sum()) / n,
    }
    return reduce(per_token, mask), metrics
