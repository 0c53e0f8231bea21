"""The reference policy for the KL term: a frozen copy of the initial policy, optionally refreshed.

Refreshing (every `ref_update_every` RL steps) by a hard copy or an exponential moving average lets
the KL anchor follow the policy slowly, as in iterative/online RLHF recipes, instead of pinning it to
the start.
"""

from __future__ import annotations

import copy

import torch

from thermik.config.schema import AlgorithmConfig


def build_reference(policy: torch.nn.Module, alg: AlgorithmConfig) -> torch.nn.Module | None:
    """A frozen copy of `policy` when the KL term is on (kl_coef > 0), else None."""
    if alg.kl.coef <= 0:
        return None
    return copy.deepcopy(policy).eval().requires_grad_(False)


@torch.no_grad()
def refresh_reference(ref: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """ref <- (1 - alpha) * ref + alpha * policy, parameter by parameter (alpha = 1 is a copy)."""
    ref_params = dict(ref.named_parameters())
    for name, p in policy.named_parameters():
        if name not in ref_params:
            raise ValueError(f"refresh_reference: the reference has no parameter {name!r}")
        ref_params[name].lerp_(p.detach().to(ref_params[name].dtype), alpha)
    ref_buffers = dict(ref.named_buffers())
    for name, b in policy.named_buffers():
        ref_buffers[name].copy_(b)


def maybe_refresh(ref: torch.nn.Module | None, policy: torch.nn.Module, alg: AlgorithmConfig, step: int) -> bool:
    """Refresh after RL step `step` (1-based) when the config asks for it; True if it did."""
    if ref is None or alg.reference.update == "frozen" or not alg.reference.every or step % alg.reference.every:
        return False
    refresh_reference(ref, policy, 1.0 if alg.reference.update == "copy" else alg.reference.ema_alpha)
    return True
