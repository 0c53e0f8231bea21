"""From rewards to advantages on a collated batch: reward shaping, KL-in-reward, zero-variance masking, estimator.

Runs between `collate` and `policy_update` and writes `batch.adv` (and, with zero-variance masking,
`batch.mask`). The math lives in `thermik.algorithms`; this file only wires it to the batch.
"""

from __future__ import annotations

import torch

from thermik.algorithms import registry
from thermik.algorithms.advantages import AdvantageContext, to_tokens
from thermik.algorithms.gae import gae_advantages_and_returns
from thermik.algorithms.kl import kl_reward_penalty
from thermik.algorithms.shaping import length_penalty, overlong_penalty, zero_variance_rows
from thermik.config.schema import AlgorithmConfig
from thermik.training.batch import TokenBatch


def _last_mask_token(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of each row's last mask token, for rows that have one."""
    keep = mask.bool()
    last = torch.where(keep, torch.arange(keep.shape[1]), -1).amax(dim=-1)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    return rows, last[rows]


def shaped_token_rewards(
    batch: TokenBatch, alg: AlgorithmConfig, max_response_length: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """The batch's token rewards plus the length-dependent terms (overlong, length penalty) on each row's last
    sampled token. Lengths are sampled tokens (mask sum)."""
    assert batch.token_rewards is not None and batch.group_ids is not None
    token_rewards = batch.token_rewards.clone()
    lengths = batch.mask.sum(dim=-1)
    extra = torch.zeros(len(batch))
    if alg.overlong_buffer:
        extra += overlong_penalty(
            lengths, alg.overlong_max_length or max_response_length, alg.overlong_buffer, alg.overlong_penalty_factor
        )
    if alg.length_penalty_coef:
        extra += length_penalty(token_rewards.sum(dim=-1), batch.group_ids, lengths, alg.length_penalty_coef)
    rows, cols = _last_mask_token(batch.mask)
    token_rewards[rows, cols] += extra[rows]
    return token_rewards, {"reward/shaping_mean": float(extra.mean())} if len(batch) else {}


def assign_advantages(
    batch: TokenBatch,
    alg: AlgorithmConfig,
    *,
    max_response_length: int,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
) -> dict[str, float]:
    """Set batch.adv [B, L-1] from the batch's rewards with the configured estimator; returns metrics.

    ref_logp: reference logprobs when alg.kl_mode == "reward" (the KL, estimated on the rollout logprobs,
    is subtracted from the token rewards); values: critic values [B, L-1] for gae, kept in batch.values with the
    GAE returns (the critic's targets, from the same shaped token rewards) in batch.returns.
    """
    assert batch.token_rewards is not None and batch.group_ids is not None, "collate sets token_rewards/group_ids"
    raw = batch.token_rewards.sum(dim=-1)
    token_rewards, metrics = shaped_token_rewards(batch, alg, max_response_length)
    if ref_logp is not None:
        kl = registry.get("kl", alg.kl_estimator)(batch.rollout_logp, ref_logp)
        token_rewards = kl_reward_penalty(token_rewards, kl, batch.mask, kl_coef)
        metrics["policy/kl"] = float((kl * batch.mask).sum()) / max(batch.num_tokens, 1)
    if alg.zero_variance_mask:
        flat = zero_variance_rows(raw, batch.group_ids)
        batch.mask = batch.mask * (~flat).to(batch.mask.dtype)[:, None]
        metrics["batch/zero_variance_frac"] = float(flat.float().mean()) if len(batch) else 0.0
    ctx = AdvantageContext(mask=batch.mask, token_rewards=token_rewards, values=values, gamma=alg.gamma, lam=alg.lam)
    estimator = registry.get("advantage", alg.advantage)
    adv, adv_metrics = estimator(token_rewards.sum(dim=-1), batch.group_ids, alg.std_eps, ctx=ctx)
    batch.adv = to_tokens(adv.to(torch.float32), batch.mask)
    if values is not None:
        batch.values = values
        _, batch.returns = gae_advantages_and_returns(token_rewards, values, batch.mask, alg.gamma, alg.lam)
    return {**metrics, **{k: float(v) for k, v in adv_metrics.items()}}
