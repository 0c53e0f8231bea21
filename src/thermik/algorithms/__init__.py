"""thermik.algorithms: advantages, policy losses, KL estimators and reductions as pure tensor functions."""

from thermik.algorithms.advantages import broadcast_to_tokens, dr_grpo_advantages, grpo_advantages
from thermik.algorithms.kl import kl_abs, kl_k1, kl_k2, kl_k3
from thermik.algorithms.losses import entropy_from_logits, ppo_clip_loss
from thermik.algorithms.reductions import sequence_mean, token_mean
from thermik.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    REDUCTIONS,
    get,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "REDUCTIONS",
    "broadcast_to_tokens",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "get",
    "grpo_advantages",
    "kl_abs",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "ppo_clip_loss",
    "sequence_mean",
    "token_mean",
]
