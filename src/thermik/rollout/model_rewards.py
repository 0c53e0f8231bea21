"""Model-based rewards composed with the environment's rule reward by weights (docs/algorithms.md, "Judges and
reward models").

After a batch of episodes is rolled out, each configured scorer (the LLM judge, the reward model) scores every
episode; the episode's return becomes

    R = env_weight * R_env + sum_j weight_j * score_j

where the environment's per-turn rewards are scaled by env_weight in place and the weighted scores are added on
the episode's last sampled token (its last sample's, for step-wise episodes).

A source that answered no episode of a group (its judge calls all failed, its reward model scored NaN) leaves
the group unscored: its return would be the failure value, not a score, so the group is sampled and logged but
not trained (`Trajectory.unscored`, `rewards/unscored_groups`; a step left with no group skips its update). Each
such step prints a warning; `rewards.max_unscored_steps` steps in a row with every group unscored stop the run,
and a run in which a source never answered ends with NothingDoneError naming the source's settings.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

from thermik.config.schema import RewardsConfig
from thermik.errors import NothingDoneError
from thermik.rollout.judge import Episode, Judge, Scores
from thermik.rollout.trajectory import Trajectory

FAILURE_CAUSES = ("timeout", "unreachable", "unparsable", "no_model", "nonfinite", "http_")  # judge/<cause> keys


class Scorer(Protocol):
    setting: str  # its config section, e.g. "rewards.judge"
    first_failure: str | None  # what its first unanswered episode met

    async def score(self, episodes: list[Episode]) -> Scores: ...

    def hint(self) -> str:
        """Which settings to check when it never answers."""
        ...


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
        self.max_unscored_steps = cfg.max_unscored_steps
        self.unlogged: list[dict[str, float]] = []  # metrics of groups the async producer scored, until a step logs
        self.asked = dict.fromkeys((name for name, _, _ in scorers), 0)  # episodes given to each source this run
        self.answered = dict.fromkeys((name for name, _, _ in scorers), 0)  # and those it scored
        self.unscored_steps = 0  # steps in a row whose every group was unscored

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
        unscored: set[int] = set()
        for name, weight, scorer in self.scorers:
            scores = await scorer.score(episodes)
            metrics.update(scores.metrics)
            self.asked[name] += len(episodes)
            self.answered[name] += sum(scores.answered)
            totals = [total + weight * s for total, s in zip(totals, scores.values, strict=True)]
            unscored |= unanswered_groups(trajs, scores.answered)
        for traj, extra in zip(trajs, totals, strict=True):
            add_final_reward(traj, self.env_weight, extra)
            traj.unscored = traj.group_id in unscored
        metrics["rewards/groups"] = float(len({t.group_id for t in trajs}))
        metrics["rewards/unscored_groups"] = float(len(unscored))
        metrics["time/model_rewards"] = time.perf_counter() - t0
        return metrics

    def after_step(self, step: int, metrics: dict[str, float]) -> None:
        """The step's verdict on its model rewards (metrics: the step's, merged): a warning naming the causes when
        groups went unscored; NothingDoneError after rewards.max_unscored_steps steps in a row with every group
        unscored."""
        unscored, groups = metrics.get("rewards/unscored_groups", 0.0), metrics.get("rewards/groups", 0.0)
        self.unscored_steps = self.unscored_steps + 1 if groups and unscored >= groups else 0
        if not unscored:
            return
        print(
            f"thermik: step {step + 1}: {self.sources()} scored no episode of {unscored:g} of {groups:g} groups "
            f"({failure_counts(metrics)}); those groups are not trained (rewards/unscored_groups)",
            file=sys.stderr,
            flush=True,
        )
        if self.max_unscored_steps and self.unscored_steps >= self.max_unscored_steps:
            raise NothingDoneError(
                f"{self.unscored_steps} steps in a row trained nothing: {self.sources()} scored no group "
                f"({self.first_failures()})",
                hint=f"{self.hints()}; rewards.max_unscored_steps = {self.max_unscored_steps} stopped the run",
            )

    def check_answered(self) -> None:
        """The run's verdict: NothingDoneError when a source was asked and never answered."""
        for name, _, scorer in self.scorers:
            if self.asked[name] and not self.answered[name]:
                raise NothingDoneError(
                    f"{scorer.setting} never answered: none of the run's {self.asked[name]} episodes got a score, "
                    f"so no group was trained (the first failure: {scorer.first_failure})",
                    hint=scorer.hint(),
                )

    def sources(self) -> str:
        return " and ".join(scorer.setting for _, _, scorer in self.scorers)

    def first_failures(self) -> str:
        return "; ".join(f"{s.setting}: {s.first_failure}" for _, _, s in self.scorers if s.first_failure)

    def hints(self) -> str:
        return "; ".join(scorer.hint() for _, _, scorer in self.scorers)


def unanswered_groups(trajs: list[Trajectory], answered: list[bool]) -> set[int]:
    """The group ids none of whose episodes a source answered."""
    groups = {t.group_id for t in trajs}
    return groups - {t.group_id for t, ok in zip(trajs, answered, strict=True) if ok}


def failure_counts(metrics: dict[str, float]) -> str:
    """'judge/http_400 8, judge/retries 0'-style counts of the failure causes in `metrics`."""
    keys = sorted(k for k in metrics if k.partition("/")[2].startswith(FAILURE_CAUSES))
    return ", ".join(f"{k} {metrics[k]:g}" for k in keys) or "no cause counted"


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The metrics of several `apply` calls as one step's: means averaged, the longest kept, counts and times summed."""
    keys = {k for part in parts for k in part}
    out = {}
    for key in keys:
        values = [part[key] for part in parts if key in part]
        if key.endswith("_mean"):
            out[key] = sum(values) / len(values)
        else:
            out[key] = max(values) if "/longest_" in key else sum(values)
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
