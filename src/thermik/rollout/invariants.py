"""Checks of invariants 1–3 (docs/architecture.md, 'Invariants') on every trajectory; a violation is a bug and
fails loudly."""

from __future__ import annotations

from thermik.rollout.trajectory import Trajectory


class TrajectoryInvariantError(AssertionError):
    pass


def check_trajectory(traj: Trajectory, sampled_per_turn: list[list[int]]) -> None:
    """The response is exactly each turn's sampled ids followed by its observation ids, in order;
    the loss mask is 1 exactly on sampled ids (or all 0 for an overlong or env-masked sample);
    per-token fields align."""
    n = len(traj.response_ids)
    for name in ("loss_mask", "rollout_logprobs", "weight_versions", "rewards"):
        if len(getattr(traj, name)) != n:
            raise TrajectoryInvariantError(f"{name} has {len(getattr(traj, name))} entries, response has {n}")
    if len(traj.turn_spans) != len(sampled_per_turn):
        raise TrajectoryInvariantError(f"{len(traj.turn_spans)} turn spans for {len(sampled_per_turn)} sampled turns")
    expected_mask: list[int] = []
    cursor = 0
    for (start, end_sampled, end_obs), sampled in zip(traj.turn_spans, sampled_per_turn, strict=True):
        if start != cursor or traj.response_ids[start:end_sampled] != sampled:
            raise TrajectoryInvariantError(f"turn at offset {start}: response does not hold the sampled ids verbatim")
        expected_mask += [1] * (end_sampled - start) + [0] * (end_obs - end_sampled)
        cursor = end_obs
    if cursor != n:
        raise TrajectoryInvariantError(f"response has {n - cursor} tokens after the last turn")
    untrained = traj.env_metrics.get("overlong", 0.0) > 0 or traj.env_metrics.get("masked", 0.0) > 0
    if traj.loss_mask != ([0] * n if untrained else expected_mask):
        raise TrajectoryInvariantError("loss mask is not 1 exactly on sampled tokens")
    for i, m in enumerate(expected_mask):
        if m == 0 and (traj.weight_versions[i] != -1 or traj.rewards[i] != 0.0):
            raise TrajectoryInvariantError(f"observation token {i} carries a weight version or a reward")
