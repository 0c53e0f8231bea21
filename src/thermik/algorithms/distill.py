"""On-policy distillation: the per-token reverse KL to a teacher as the advantage.

Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes" (GKD with
the student's own samples and the reverse KL); the Tinker cookbook's on-policy distillation recipe (Thinking
Machines 2025) uses this per-token form. The student samples x ~ pi; the teacher scores every sampled token; with
logp = log pi(x_t | x_<t) and teacher_logp = log q(x_t | x_<t),

    k_t = logp_t - teacher_logp_t           an unbiased one-sample estimate of KL(pi || q) at step t
    A_t = -coef * k_t                        on sampled tokens (mask 1), 0 elsewhere

Maximizing sum_t A_t log pi(x_t) with a policy-gradient loss moves pi toward q where it assigns the sampled token
more mass than q does (mode-seeking). docs/algorithms.md, "On-policy distillation".
"""

from __future__ import annotations

from torch import Tensor


def reverse_kl_advantage(
    logp: Tensor, teacher_logp: Tensor, mask: Tensor, coef: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    """(adv [N, T] = -coef * (logp - teacher_logp) * mask, metrics) from logp, teacher_logp, mask of shape [N, T]
    (logp: the sampling policy's logprobs of the sampled tokens). Metrics: `teacher/kl` (mean k_t per masked token)
    and `teacher/kl_seq` (mean over rows of each row's summed k_t)."""
    if logp.shape != teacher_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"reverse_kl_advantage: logp {tuple(logp.shape)}, teacher_logp {tuple(teacher_logp.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape"
        )
    mask = mask.to(logp.dtype)
    kl = (logp - teacher_logp) * mask
    tokens = float(mask.sum())
    metrics = {
        "teacher/kl": float(kl.sum()) / max(tokens, 1.0),
        "teacher/kl_seq": float(kl.sum(dim=-1).mean()) if len(kl) else 0.0,
    }
    return -coef * kl, metrics
