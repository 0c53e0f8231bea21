"""Episodes that train as several rows (step-wise samples): returns per row and reduction weights per row.

With `rollout.step_wise`, one episode may contribute several training rows (docs/algorithms.md, 'Step-wise
trajectories'). `episode_ids [N]` names each row's episode; an episode's rows are contiguous and in turn order.
Like SkyRL's step-wise training, every row of an episode may score the episode's return, with group statistics
taken over episodes; these functions are the tensor side of those rules.
"""

from __future__ import annotations

import torch
from torch import Tensor


def episode_index(episode_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(index [N] in 0..E-1 per row, first [E]: each episode's first row). Rows of an episode must be contiguous."""
    if episode_ids.dim() != 1:
        raise ValueError(f"episode_ids must be [N], got {tuple(episode_ids.shape)}")
    starts = torch.ones_like(episode_ids, dtype=torch.bool)
    starts[1:] = episode_ids[1:] != episode_ids[:-1]
    index = torch.cumsum(starts.long(), 0) - 1
    if len(torch.unique(episode_ids)) != int(starts.sum()):
        raise ValueError("episode_ids: an episode's rows must be contiguous")
    return index, torch.nonzero(starts).squeeze(-1)


def has_multi_row_episodes(episode_ids: Tensor | None) -> bool:
    return episode_ids is not None and len(torch.unique(episode_ids)) < episode_ids.numel()


def episode_totals(row_values: Tensor, index: Tensor) -> Tensor:
    """[N] -> [E]: the sum over each episode's rows."""
    num = int(index.max().item()) + 1 if index.numel() else 0
    return torch.zeros(num, dtype=row_values.dtype).index_add(0, index, row_values)


def returns_to_go(row_returns: Tensor, episode_ids: Tensor) -> Tensor:
    """[N] -> [N]: for each row, the sum of its episode's row returns from this row to the episode's last row."""
    index, first = episode_index(episode_ids)
    totals = episode_totals(row_returns, index)
    before = torch.cumsum(row_returns, 0) - row_returns  # the sum over all rows before this one
    return totals[index] - (before - before[first][index])


def episode_row_weights(
    episode_ids: Tensor, row_tokens: Tensor, group_ids: Tensor | None = None, per_prompt: bool = False
) -> Tensor:
    """[N] weights w_r of a per-row token mean so that sum_r w_r * mean_r is a mean over episodes of each episode's
    token mean: w_r = tokens_r / tokens_e / E (`sequence_mean`), or with per_prompt, / (P * episodes of the prompt)
    instead of / E (`prompt_mean`). An episode without mask tokens weighs 0 but counts in E."""
    index, first = episode_index(episode_ids)
    tokens_e = episode_totals(row_tokens.to(torch.float32), index)
    share = row_tokens.to(torch.float32) / tokens_e[index].clamp(min=1.0)
    if not per_prompt:
        return share / max(len(first), 1)
    if group_ids is None:
        raise ValueError("episode_row_weights: per_prompt needs group_ids")
    _, g_index, counts = torch.unique(group_ids[first], return_inverse=True, return_counts=True)
    per_episode = 1.0 / (counts.numel() * counts[g_index].to(torch.float32))
    return share * per_episode[index]
