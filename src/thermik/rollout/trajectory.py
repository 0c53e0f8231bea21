"""Trajectory: one sampled episode in exact token ids (docs/architecture.md, 'Contracts')."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from thermik.inference.base import StopReason


@dataclass
class Trajectory:
    """prompt_ids + response_ids is exactly the sequence the engine saw and produced.

    response_ids holds sampled tokens and the observation tokens the loop appended, in order.
    loss_mask, rollout_logprobs, weight_versions and rewards are aligned with response_ids:
    loss_mask is 1 on sampled tokens only; rollout_logprobs/weight_versions are 0 / -1 on
    observation tokens; rewards[i] is the reward of the turn whose last sampled token is i.
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    stop_reason: StopReason | str = "stop"
    num_turns: int = 0
    group_id: int = 0
    env_name: str = ""
    env_metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=lambda: {"llm": 0.0, "env": 0.0})
    turn_spans: list[tuple[int, int, int]] = field(default_factory=list)
    """Per turn (start, end_sampled, end_observation) offsets into response_ids, for the prefix check."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation as text, for dumps and debugging only (never re-tokenized)."""
    unscored: bool = False
    """A model reward source ([rewards]) answered no episode of this one's group: sampled and logged, never trained
    (rollout/model_rewards.py)."""
    continuations: list[Trajectory] = field(default_factory=list)
    """Step-wise samples after this one, in order: each starts where the episode's next prompt stopped extending the
    tokens before it (rollout.step_wise). They carry only token fields, turn_spans and group_id; the episode's
    stop reason, turns, metrics, timings and messages live on this first sample (docs/algorithms.md)."""

    @property
    def samples(self) -> list[Trajectory]:
        """The episode's training samples: this one, then its continuations."""
        return [self, *self.continuations]

    @property
    def reward(self) -> float:
        """The episode's return: every sample's rewards."""
        return float(sum(self.rewards) + sum(sum(c.rewards) for c in self.continuations))

    @property
    def num_generated_tokens(self) -> int:
        """Sampled tokens of the whole episode, counted even when an overlong sample's loss mask was zeroed."""
        return sum(end_sampled - start for s in self.samples for start, end_sampled, _ in s.turn_spans)

    @property
    def all_weight_versions(self) -> list[int]:
        """Weight versions of every sample's tokens (observation tokens carry -1)."""
        return [v for s in self.samples for v in s.weight_versions]

    def add_final_reward(self, reward: float) -> bool:
        """`reward` on the last sampled token of the episode's last sample that sampled anything; False (nothing
        placed) when no sample did."""
        last = next((s for s in reversed(self.samples) if s.turn_spans), None)
        if last is not None:
            last.rewards[last.turn_spans[-1][1] - 1] += reward
        return last is not None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def dump_trajectories(path: Path, trajs: list[Trajectory]) -> None:
    """One JSON object per line, for people reading what the policy did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trajs:
            f.write(json.dumps(t.to_json()) + "\n")
