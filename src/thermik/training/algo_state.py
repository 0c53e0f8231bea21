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
            AdaptiveKLController(alg.kl_coef, alg.kl_target, alg.kl_horizon)
            if alg.kl_controller == "adaptive"
            else FixedKLController(alg.kl_coef)
        )
        return cls(
            kl=kl,
            guard=NonFiniteGuard(alg.max_nonfinite_steps, halt=alg.on_nonfinite == "halt"),
            degenerate=DegenerateRatioDetector(alg.degenerate_patience, halt=alg.halt_on_degenerate),
        )

    def after_update(self, metrics: dict[str, float], num_samples: int) -> dict[str, float]:
        """Adapt the KL weight to the measured KL and check the ratio; returns the metrics to log."""
        if "policy/kl" in metrics:
            self.kl.update(metrics["policy/kl"], num_samples)
        self.degenerate.observe(metrics.get("health/ratio_std_updated"), metrics.get("policy/lr", 0.0))
        return {"policy/kl_coef": self.kl.value, "health/degenerate_streak": float(self.degenerate.streak)}
