"""From rewards to advantages on a collated batch: reward shaping, KL-in-reward, zero-variance masking, estimator.

Runs between `collate` and `policy_update` and writes `batch.adv` (and, with zero-variance masking,
`batch.mask`). The math lives in `thermik.algorithms`; this file only wires it to the batch.
"""

from __future__ import annotations

import torch

from thermik.algorithms import registry
from thermik.algorithms.advantages import AdvantageContext, to_tokens
from thermik.algorithms.distill import reverse_kl_advantage
from thermik.algorithms.episodes import episode_index, episode_totals, has_multi_row_episodes, returns_to_go
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
    if alg.shaping.overlong_buffer:
        extra += overlong_penalty(
            lengths,
            alg.shaping.overlong_max_length or max_response_length,
            alg.shaping.overlong_buffer,
            alg.shaping.overlong_penalty_factor,
        )
    if alg.shaping.length_penalty_coef:
        extra += length_penalty(token_rewards.sum(dim=-1), batch.group_ids, lengths, alg.shaping.length_penalty_coef)
    rows, cols = _last_mask_token(batch.mask)
    token_rewards[rows, cols] += extra[rows]
    return token_rewards, {"reward/shaping_mean": float(extra.mean())} if len(batch) else {}


TOKEN_LEVEL_ESTIMATORS = frozenset({"reinforce_pp", "reinforce_pp_baseline", "gae"})
"""Estimators that read the token rewards of every row; the others score each row (outcome estimators)."""


def step_rewards(
    batch: TokenBatch, token_rewards: torch.Tensor, rule: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(row returns [B], token rewards [B, L-1], the episode's first rows [E] or None) under
    `algorithm.advantage.step_rewards` when an episode trains as several rows: 'episode' scores every row with its
    episode's return (placed on the row's last sampled token), 'per-step' with the env rewards from the row's first
    turn to the episode's end.
    Outcome estimators then run on each episode's first row only, so groups are counted in episodes."""
    row_returns = token_rewards.sum(dim=-1)
    if not has_multi_row_episodes(batch.episode_ids):
        return row_returns, token_rewards, None
    assert batch.episode_ids is not None
    index, first = episode_index(batch.episode_ids)
    if rule == "episode":
        scores = episode_totals(row_returns, index)[index]
        token_rewards = torch.zeros_like(token_rewards)
    else:
        scores = returns_to_go(row_returns, batch.episode_ids)
        token_rewards = token_rewards.clone()
    rows, cols = _last_mask_token(batch.mask)
    token_rewards[rows, cols] += (scores - (0 if rule == "episode" else row_returns))[rows]
    return scores, token_rewards, first if rule == "episode" else None


def _estimate(
    alg: AlgorithmConfig, batch: TokenBatch, scores: torch.Tensor, ctx: AdvantageContext, first: torch.Tensor | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The estimator on every row, or (an outcome estimator, episodes of several rows) on each episode's first
    row with the episode's sampled length, its advantage then given to every row of the episode."""
    assert batch.group_ids is not None
    estimator = registry.get("advantage", alg.advantage.type)
    if first is None or alg.advantage.type in TOKEN_LEVEL_ESTIMATORS:
        return estimator(scores, batch.group_ids, alg.advantage.std_eps, ctx=ctx)
    assert batch.episode_ids is not None
    index, _ = episode_index(batch.episode_ids)
    lengths = episode_totals(batch.mask.sum(dim=-1), index)
    token_rewards = None if ctx.token_rewards is None else ctx.token_rewards[first]
    sub = AdvantageContext(batch.mask[first], token_rewards, None, lengths, alg.advantage.gamma, alg.advantage.lam)
    adv, metrics = estimator(scores[first], batch.group_ids[first], alg.advantage.std_eps, ctx=sub)
    return adv[index], metrics


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

    ref_logp: reference logprobs when alg.kl.mode == "reward" (the KL, estimated on the rollout logprobs,
    is subtracted from the token rewards); values: critic values [B, L-1] for gae, kept in batch.values with the
    GAE returns (the critic's targets, from the same shaped token rewards) in batch.returns. An episode of several
    rows (step-wise samples) is scored by `step_rewards`.
    """
    assert batch.token_rewards is not None and batch.group_ids is not None, "collate sets token_rewards/group_ids"
    raw, _, _ = step_rewards(batch, batch.token_rewards, alg.advantage.step_rewards)
    token_rewards, metrics = shaped_token_rewards(batch, alg, max_response_length)
    scores, token_rewards, first = step_rewards(batch, token_rewards, alg.advantage.step_rewards)
    if ref_logp is not None:
        kl = registry.get("kl", alg.kl.estimator)(batch.rollout_logp, ref_logp)
        token_rewards = kl_reward_penalty(token_rewards, kl, batch.mask, kl_coef)
        scores = token_rewards.sum(dim=-1)
        metrics["policy/kl"] = float((kl * batch.mask).sum()) / max(batch.num_tokens, 1)
    if alg.shaping.zero_variance_mask:
        flat = zero_variance_rows(raw, batch.group_ids)
        batch.mask = batch.mask * (~flat).to(batch.mask.dtype)[:, None]
        metrics["batch/zero_variance_frac"] = float(flat.float().mean()) if len(batch) else 0.0
    ctx = AdvantageContext(
        mask=batch.mask, token_rewards=token_rewards, values=values, gamma=alg.advantage.gamma, lam=alg.advantage.lam
    )
    adv, adv_metrics = _estimate(alg, batch, scores, ctx, first)
    batch.adv = to_tokens(adv.to(torch.float32), batch.mask)
    if values is not None:
        batch.values = values
        _, batch.returns = gae_advantages_and_returns(
            token_rewards, values, batch.mask, alg.advantage.gamma, alg.advantage.lam
        )
    return {**metrics, **{k: float(v) for k, v in adv_metrics.items()}}


DISTILL_MODES = {
    "distill": lambda env_adv, distill_adv: distill_adv,  # pure distillation: the environment reward is not used
    "combined": lambda env_adv, distill_adv: env_adv + distill_adv,
}


def apply_distillation(batch: TokenBatch, teacher_logp: torch.Tensor, alg: AlgorithmConfig) -> dict[str, float]:
    """Fold the per-token reverse KL to the teacher into batch.adv (after `assign_advantages`), per
    `alg.teacher.mode`; the student's logprobs are the rollout's (the sampling policy). Returns teacher/* metrics."""
    distill_adv, metrics = reverse_kl_advantage(batch.rollout_logp, teacher_logp, batch.mask, alg.teacher.coef)
    batch.adv = DISTILL_MODES[alg.teacher.mode](batch.adv, distill_adv)
    return metrics
