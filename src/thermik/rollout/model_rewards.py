"""Model-based rewards composed with the environment's rule reward by weights (docs/algorithms.md, "Judges and
reward models").

After a batch of episodes is rolled out, each configured scorer (the LLM judge, the reward model) scores every
episode; the episode's return becomes

    R = env_weight * R_env + sum_j weight_j * score_j

where the environment's per-turn rewards are scaled by env_weight in place and the weighted scores are added on
the episode's last sampled token (its last sample's, for step-wise episodes).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from thermik.config.schema import RewardsConfig
from thermik.rollout.judge import Episode, Judge
from thermik.rollout.trajectory import Trajectory


class Scorer(Protocol):
    async def score(self, episodes: list[Episode]) -> tuple[list[float], dict[str, float]]: ...


def episode_of(traj: Trajectory, row: dict[str, Any]) -> Episode:
    prompt_len = len(row.get("prompt", []))
    truth = row.get("reward_spec", {}).get("ground_truth")
    return Episode(prompt=traj.messages[:prompt_len], response=traj.messages[prompt_len:], ground_truth=truth)


def add_final_reward(traj: Trajectory, env_weight: float, extra: float) -> None:
    """Scale the episode's environment rewards by env_weight and add `extra` on its last sampled token."""
    for sample in traj.samples:
        sample.rewards = [env_weight * r for r in sample.rewards]
    last = next((s for s in reversed(traj.samples) if any(s.loss_mask)), traj.samples[-1])
    if not last.rewards:
        last.rewards = [0.0] * len(last.response_ids)
    sampled = [i for i, m in enumerate(last.loss_mask) if m]
    index = sampled[-1] if sampled else len(last.rewards) - 1
    if index >= 0:
        last.rewards[index] += extra


class ModelRewards:
    """The configured scorers with their weights."""

    def __init__(self, cfg: RewardsConfig, scorers: list[tuple[str, float, Scorer]]) -> None:
        self.env_weight = cfg.env_weight
        self.scorers = scorers
        self.unlogged: list[dict[str, float]] = []  # metrics of groups the async producer scored, until a step logs

    def take_unlogged(self) -> dict[str, float]:
        """The merged metrics of the `apply` calls made since the last take (asynchronous training)."""
        parts, self.unlogged = self.unlogged, []
        return merge_metrics(parts)

    async def apply(self, trajs: list[Trajectory], rows: list[dict[str, Any]]) -> dict[str, float]:
        """Score `trajs` (trajs[i] played rows[trajs[i].group_id]) and fold the weighted scores into their rewards;
        returns the scorers' metrics and `time/model_rewards`."""
        t0 = time.perf_counter()
        episodes = [episode_of(t, rows[t.group_id]) for t in trajs]
        totals = [0.0] * len(trajs)
        metrics: dict[str, float] = {}
        for _, weight, scorer in self.scorers:
            scores, scorer_metrics = await scorer.score(episodes)
            metrics.update(scorer_metrics)
            totals = [total + weight * s for total, s in zip(totals, scores, strict=True)]
        for traj, extra in zip(trajs, totals, strict=True):
            add_final_reward(traj, self.env_weight, extra)
        metrics["time/model_rewards"] = time.perf_counter() - t0
        return metrics


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The metrics of several `apply` calls as one step's: means averaged, counts and times summed."""
    keys = {k for part in parts for k in part}
    out = {}
    for key in keys:
        values = [part[key] for part in parts if key in part]
        out[key] = sum(values) / len(values) if key.endswith("_mean") else sum(values)
    return out


def build_model_rewards(cfg: RewardsConfig) -> ModelRewards | None:
    """The judge (rewards.judge.base_url set) and the reward model (rewards.reward_model.path set); None if neither."""
    scorers: list[tuple[str, float, Scorer]] = []
    if cfg.judge.base_url:
        scorers.append(("judge", cfg.judge.weight, Judge(cfg.judge)))
    if cfg.reward_model.path:
        from thermik.rollout.reward_model import RewardModel  # loads a model: only when one is configured

        scorers.append(("reward_model", cfg.reward_model.weight, RewardModel(cfg.reward_model)))
    return ModelRewards(cfg, scorers) if scorers else None
