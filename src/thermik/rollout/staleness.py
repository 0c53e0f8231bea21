"""Bounded staleness, the one rule of asynchronous training (docs/architecture.md): a sample made by the weights of
version v may train step s only if s - v <= the run's staleness bound. Versions and steps count the same optimizer
steps. `max_staleness` is the one reader of that bound's setting, and `is_asynchronous` the one test of it, for every
run mode (local, Ray, split trainer and orchestrator, replay)."""

from __future__ import annotations

from collections.abc import Sequence

from thermik.config.schema import RunConfig


def max_staleness(cfg: RunConfig) -> int:
    """How many optimizer steps older than the step it trains a sample may be (trainer.max_async_steps);
    0: synchronous training, every sample made by the weights it trains."""
    return cfg.trainer.max_async_steps


def is_asynchronous(cfg: RunConfig) -> bool:
    """Whether rollouts go on while the trainer trains (a staleness bound above 0): the rollout logprobs are then
    the behaviour policy of the update."""
    return max_staleness(cfg) > 0


def within_staleness(sample_version: int, train_step: int, bound: int) -> bool:
    """Whether a sample made by weights `sample_version` may train step `train_step` (bound 0: on-policy only)."""
    return train_step - sample_version <= bound


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
