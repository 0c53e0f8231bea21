"""What the algorithm remembers across RL steps: the KL weight and the health counters."""

from __future__ import annotations

from dataclasses import dataclass

from thermik.algorithms.health import DegenerateRatioDetector, NonFiniteGuard
from thermik.algorithms.kl import AdaptiveKLController, FixedKLController
from thermik.config.schema import AlgorithmConfig


@dataclass
class AlgorithmState:
    kl: FixedKLController | AdaptiveKLController
    guard: NonFiniteGuard
    degenerate: DegenerateRatioDetector

    @classmethod
    def from_config(cls, alg: AlgorithmConfig) -> AlgorithmState:
        kl: FixedKLController | AdaptiveKLController = (
            AdaptiveKLController(alg.kl.coef, alg.kl.target, alg.kl.horizon)
            if alg.kl.controller == "adaptive"
            else FixedKLController(alg.kl.coef)
        )
        return cls(
            kl=kl,
            guard=NonFiniteGuard(alg.health.max_nonfinite_steps, halt=alg.health.on_nonfinite == "halt"),
            degenerate=DegenerateRatioDetector(alg.health.degenerate_patience, halt=alg.health.halt_on_degenerate),
        )

    def after_update(self, metrics: dict[str, float], num_samples: int) -> dict[str, float]:
        """Adapt the KL weight to the measured KL and check the ratio; returns the metrics to log."""
        if "policy/kl" in metrics:
            self.kl.update(metrics["policy/kl"], num_samples)
        self.degenerate.observe(metrics.get("health/ratio_std_updated"), metrics.get("policy/lr", 0.0))
        return {"policy/kl_coef": self.kl.value, "health/degenerate_streak": float(self.degenerate.streak)}
