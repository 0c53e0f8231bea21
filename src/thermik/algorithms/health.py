"""Training-health checks that need memory across steps: a degenerate importance ratio and non-finite losses."""

from __future__ import annotations

import math
import warnings


class DegenerateRatioError(RuntimeError):
    """The policy stopped moving while the learning rate says it should."""


class NonFiniteLossError(RuntimeError):
    """The loss was NaN/inf for too many optimizer steps in a row."""


class DegenerateRatioDetector:
    """Warns (or raises when `halt`) after `patience` consecutive steps with ratio std < `threshold` and lr > 0.

    The ratio exp(logp - old_logp) is informative only after the policy has taken an optimizer step on
    the batch (mini-batches 2..M); on-policy, in the first mini-batch, it is exactly 1 by construction.
    A std stuck at 0 there means the update does not change the policy: frozen or detached parameters,
    a zero gradient, or logprobs recomputed after the step. Steps without the measurement are skipped.
    """

    def __init__(self, patience: int, threshold: float = 1e-7, halt: bool = False) -> None:
        if patience < 1:
            raise ValueError(f"degenerate-ratio patience must be >= 1, got {patience}")
        self.patience, self.threshold, self.halt = patience, threshold, halt
        self.streak = 0

    def observe(self, ratio_std: float | None, lr: float) -> bool:
        """Record one step; True when the streak has reached `patience` (after warning or raising)."""
        if ratio_std is None:
            return False
        self.streak = self.streak + 1 if (lr > 0 and ratio_std < self.threshold) else 0
        if self.streak < self.patience:
            return False
        msg = (
            f"importance ratio std < {self.threshold:g} for {self.streak} steps with lr = {lr:g}: the updates do "
            "not change the policy (frozen/detached parameters, zero gradients, or old logprobs recomputed after "
            "the step?)"
        )
        if self.halt:
            raise DegenerateRatioError(msg + "; stopping because algorithm.halt_on_degenerate is set")
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return True


class NonFiniteGuard:
    """Counts consecutive optimizer steps whose loss or gradient norm was NaN/inf; raises after `max_consecutive`."""

    def __init__(self, max_consecutive: int) -> None:
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.streak = 0
        self.skipped = 0

    def ok(self, loss: float, grad_norm: float) -> bool:
        """True when the optimizer may step; False (skip the step) when loss or grad norm is not finite."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.streak = 0
            return True
        self.streak += 1
        self.skipped += 1
        if self.streak >= self.max_consecutive:
            raise NonFiniteLossError(
                f"loss or gradient norm was NaN/inf in {self.streak} consecutive optimizer steps (last loss {loss}, "
                f"grad norm {grad_norm}); those steps were skipped. Lower the learning rate, check the rewards and "
                "the model dtype, or raise algorithm.max_nonfinite_steps."
            )
        return False
