"""Loss reductions: turn a per-token tensor [N, T] into the scalar that is differentiated.

The trainer splits a mini-batch into micro-batches and accumulates gradients. For the gradient
to be independent of that split, every reduction takes the *mini-batch* normalizer explicitly:
the sum of the micro-batch results then equals the reduction of the whole mini-batch.
Masked positions are selected with `torch.where`, so NaN/inf there (padding) cannot leak into
the value or the gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(x: Tensor, mask: Tensor) -> None:
    if x.dim() != 2 or x.shape != mask.shape:
        shapes = f"x {tuple(x.shape)}, mask {tuple(mask.shape)}"
        raise ValueError(f"expected x and mask of the same shape [N, T]; got {shapes}")


def token_mean(x: Tensor, mask: Tensor, normalizer: float | None = None) -> Tensor:
    """Sum of `x` over mask tokens divided by `normalizer` (DAPO's token-level mean, Yu et al. 2025).

    x, mask: [N, T]. normalizer: total number of mask tokens in the whole mini-batch; None uses
    this tensor's own count (right only when the mini-batch is not split). Returns a scalar.
    """
    _check(x, mask)
    keep = mask.bool()
    if normalizer is None:
        normalizer = max(float(keep.sum().item()), 1.0)
    elif normalizer <= 0:
        raise ValueError(f"token_mean: normalizer must be > 0, got {normalizer}")
    return torch.where(keep, x, torch.zeros_like(x)).sum() / normalizer


def sequence_mean(x: Tensor, mask: Tensor, num_sequences: int | None = None) -> Tensor:
    """Mean over mask tokens within each sequence, then sum over sequences / `num_sequences` (GRPO, Shao et al. 2024).

    x, mask: [N, T]. num_sequences: number of sequences in the whole mini-batch; None uses N.
    A sequence with no mask token contributes 0. Returns a scalar.
    """
    _check(x, mask)
    keep = mask.bool()
    if num_sequences is None:
        num_sequences = x.shape[0]
    if num_sequences <= 0:
        raise ValueError(f"sequence_mean: num_sequences must be > 0, got {num_sequences}")
    per_seq = torch.where(keep, x, torch.zeros_like(x)).sum(dim=-1) / keep.sum(dim=-1).clamp(min=1).to(x.dtype)
    return per_seq.sum() / num_sequences
