"""Per-token estimators of KL(pi || pi_ref) from sampled-token log-probabilities.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). With
samples x ~ pi and log_r = ref_logp - logp:
  k1 = -log_r               unbiased, high variance, can be negative per token
  k2 = log_r**2 / 2         biased, low variance
  k3 = exp(log_r) - log_r - 1   unbiased, low variance, always >= 0 (used by GRPO)
All take logp, ref_logp of shape [N, T] and return [N, T]; reduce with a mask afterwards.
"""

from __future__ import annotations

import torch
from torch import Tensor

# k3 exponentiates the log-ratio: one token where the policy has drifted far from the reference
# would give exp(huge) and dominate (or overflow) the loss, so the log-ratio is clamped first.
K3_MAX_LOG_RATIO = 10.0


def _log_ratio(logp: Tensor, ref_logp: Tensor) -> Tensor:
    if logp.shape != ref_logp.shape:
        raise ValueError(f"kl: logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ in shape")
    return ref_logp - logp


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp."""
    return -_log_ratio(logp, ref_logp)


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (logp - ref_logp)**2 / 2."""
    return 0.5 * _log_ratio(logp, ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor, max_log_ratio: float = K3_MAX_LOG_RATIO) -> Tensor:
    """k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1, the log-ratio clamped to +-max_log_ratio."""
    log_r = _log_ratio(logp, ref_logp).clamp(-max_log_ratio, max_log_ratio)
    return torch.exp(log_r) - log_r - 1.0


def kl_abs(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """|logp - ref_logp|."""
    return _log_ratio(logp, ref_logp).abs()


def kl_reward_penalty(token_rewards: Tensor, kl: Tensor, mask: Tensor, coef: float) -> Tensor:
    """KL as a reward penalty (Ziegler et al. 2019; Ouyang et al. 2022): r_t - coef * kl_t on mask tokens.

    token_rewards, kl, mask: [N, T]. The advantage estimator then sees the penalised rewards.
    """
    if not (token_rewards.shape == kl.shape == mask.shape):
        shapes = [tuple(t.shape) for t in (token_rewards, kl, mask)]
        raise ValueError(f"kl_reward_penalty: token_rewards, kl, mask must share one shape; got {shapes}")
    return token_rewards - coef * torch.where(mask.bool(), kl.detach(), torch.zeros_like(kl))


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, coef: float) -> None:
        self.value = coef

    def update(self, current_kl: float, n_steps: int) -> float:
        del current_kl, n_steps
        return self.value


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences").

    e = clip(KL / target - 1, -0.2, 0.2); beta <- beta * (1 + e * n_steps / horizon), where n_steps is the
    number of samples seen since the last update. KL above target raises beta, below lowers it.
    """

    def __init__(self, coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0; got {target}, {horizon}")
        self.value, self.target, self.horizon = coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value
