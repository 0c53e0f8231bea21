"""Bounded staleness, the one rule of asynchronous training (docs/architecture.md): a sample made by the weights of
version v may train step s only if s - v <= max_off_policy_steps. Versions and steps count the same optimizer steps."""

from __future__ import annotations

from collections.abc import Sequence


def within_staleness(sample_version: int, train_step: int, max_off_policy_steps: int) -> bool:
    """Whether a sample made by weights `sample_version` may train step `train_step` (0: on-policy only)."""
    return train_step - sample_version <= max_off_policy_steps


def staleness_metrics(staleness: Sequence[int]) -> dict[str, float]:
    """`off_policy/staleness_mean|max` of the per-sample (or per-group) staleness s - v of one training batch."""
    return {
        "off_policy/staleness_mean": sum(staleness) / len(staleness),
        "off_policy/staleness_max": float(max(staleness)),
    }


def token_staleness_metrics(samples: Sequence[Sequence[int]], train_step: int) -> dict[str, float]:
    """Per sampled token of one training batch (`samples`: each sample's token versions): `off_policy/
    token_staleness_mean|max` (train_step - v), and `off_policy/versions_per_sample_max`, the most weight versions
    one sample spans (above 1: a weight update landed while it was generated, and it went on under the new one)."""
    tokens = [train_step - v for versions in samples for v in versions]
    return {
        "off_policy/token_staleness_mean": sum(tokens) / len(tokens) if tokens else 0.0,
        "off_policy/token_staleness_max": float(max(tokens, default=0)),
        "off_policy/versions_per_sample_max": float(max((len(set(vs)) for vs in samples), default=0)),
    }
