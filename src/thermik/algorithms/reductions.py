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


def seq_mean_token_sum_norm(x: Tensor, mask: Tensor, num_sequences: int | None = None, constant: float = 1.0) -> Tensor:
    """Per-sequence token *sum* divided by a constant, then sum / `num_sequences` (Dr. GRPO, Liu et al. 2025).

    x, mask: [N, T]. constant: the same for every sequence (e.g. the max response length), so a long
    response is not down-weighted per token as in `sequence_mean`. num_sequences: sequences in the whole
    mini-batch; None uses N. Returns a scalar.
    """
    _check(x, mask)
    if constant <= 0:
        raise ValueError(f"seq_mean_token_sum_norm: constant must be > 0, got {constant}")
    if num_sequences is None:
        num_sequences = x.shape[0]
    if num_sequences <= 0:
        raise ValueError(f"seq_mean_token_sum_norm: num_sequences must be > 0, got {num_sequences}")
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum() / (constant * num_sequences)


def prompt_weights(group_ids: Tensor) -> Tensor:
    """[N] int -> [N] float: 1 / (number of prompts * samples of this row's prompt), for `prompt_mean`."""
    if group_ids.dim() != 1:
        raise ValueError(f"prompt_weights: group_ids must be [N], got {tuple(group_ids.shape)}")
    _, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return 1.0 / (counts.numel() * counts[index].to(torch.float32))


def prompt_mean(x: Tensor, mask: Tensor, seq_weights: Tensor) -> Tensor:
    """Mean over mask tokens within each sequence, then over the sequences of each prompt, then over prompts.

    x, mask: [N, T]; seq_weights [N] from `prompt_weights(group_ids of the whole mini-batch)`, sliced
    to these rows (the weights carry the mini-batch counts, which keeps the micro-batch split out of the
    gradient). Every prompt weighs the same, whatever its number of samples or their lengths. Scalar.
    """
    return weighted_sequence_mean(x, mask, seq_weights)


def weighted_sequence_mean(x: Tensor, mask: Tensor, seq_weights: Tensor) -> Tensor:
    """sum_i seq_weights[i] * (mean of x over row i's mask tokens): `prompt_mean`'s formula, and `sequence_mean` /
    `prompt_mean` over episodes that train as several rows (weights from `episodes.episode_row_weights`).

    x, mask: [N, T]; seq_weights [N], computed over the whole mini-batch and sliced to these rows. Scalar.
    """
    _check(x, mask)
    if seq_weights.shape != (x.shape[0],):
        raise ValueError(f"seq_weights must be [N] = [{x.shape[0]}], got {tuple(seq_weights.shape)}")
    keep = mask.bool()
    per_seq = torch.where(keep, x, torch.zeros_like(x)).sum(dim=-1) / keep.sum(dim=-1).clamp(min=1).to(x.dtype)
    return (per_seq * seq_weights.to(x.dtype)).sum()
