"""Training-health checks that need memory across steps: a degenerate importance ratio and non-finite losses."""

from __future__ import annotations

import math
import warnings

import torch


class DegenerateRatioError(RuntimeError):
    """The policy stopped moving while the learning rate says it should."""


class NonFiniteLossError(RuntimeError):
    """The loss was NaN/inf for too many optimizer steps in a row."""


class DegenerateRatioDetector:
    """Warns (or raises when `halt`) after `patience` consecutive steps with ratio std < `threshold` and lr > 0.

    The ratio exp(logp - old_logp) is informative only after the policy has taken an optimizer step on
    the batch (mini-batches 2..M); on-policy, in the first mini-batch, it is exactly 1 by construction.
    A std stuck at 0 there means the update does not change the policy: frozen or detached parameters,
    a zero gradient, or logprobs recomputed after the step. Steps without the measurement are skipped. "Stuck at 0"
    allows float32 rounding: the no-grad and the grad forward of the same weights may sum in another order (on an
    AVX2 CPU a frozen policy's ratio std measured 2.5e-7), while a real update moves it by far more than 1e-5.
    """

    def __init__(self, patience: int, threshold: float = 1e-5, halt: bool = False) -> None:
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
            raise DegenerateRatioError(msg + "; stopping because algorithm.health.halt_on_degenerate is set")
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return True


class NonFiniteGuard:
    """NaN/inf in a step's inputs (rewards, rollout logprobs) or an optimizer step (loss, gradient).

    `halt`: raise at the first one. Otherwise the step is skipped (the caller does not update) and the run fails
    after `max_consecutive` skipped steps in a row. Each message names the culprit.
    """

    def __init__(self, max_consecutive: int, halt: bool = False) -> None:
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        self.max_consecutive, self.halt = max_consecutive, halt
        self.streak = 0
        self.skipped = 0

    def ok(self, loss: float, grad_norm: float, culprit: str = "") -> bool:
        """True when the optimizer may step; False (skip the step) when loss or grad norm is not finite.
        `culprit` names what made the gradient non-finite (e.g. the first parameter with a NaN gradient)."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.streak = 0
            return True
        what = "the loss" if not math.isfinite(loss) else f"the gradient ({culprit or 'norm'})"
        self.reject(f"{what}: loss {loss}, grad norm {grad_norm}", "optimizer steps")
        return False

    def reject(self, culprit: str, unit: str = "steps") -> None:
        """Count one skipped step caused by `culprit`; raises when halting or after too many in a row."""
        self.streak += 1
        self.skipped += 1
        if self.halt:
            raise NonFiniteLossError(f"NaN/inf in {culprit}; stopping because algorithm.health.on_nonfinite = 'halt'")
        if self.streak >= self.max_consecutive:
            raise NonFiniteLossError(
                f"NaN/inf in {self.streak} consecutive {unit} (last: {culprit}); those steps were skipped. Lower the "
                "learning rate, check the rewards and the model dtype, or raise algorithm.health.max_nonfinite_steps."
            )
        warnings.warn(f"NaN/inf in {culprit}: step skipped", RuntimeWarning, stacklevel=3)


def nonfinite_entries(name: str, values: torch.Tensor, where: torch.Tensor | None = None) -> tuple[int, str]:
    """(count, description of the first) of the NaN/inf entries of `values` [B, ...] (only where `where` != 0)."""
    bad = ~torch.isfinite(values)
    if where is not None:
        bad &= where != 0
    count = int(bad.sum())
    if not count:
        return 0, ""
    first = [int(i) for i in bad.nonzero()[0]]
    at = f"sample {first[0]}" + (f" token {first[1]}" if len(first) > 1 else "")
    return count, f"{count} {name} value(s), the first at {at}: {float(values[tuple(first)])}"
