"""Batch shaping, KL controllers and off-policy weights against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from thermik.algorithms import AdaptiveKLController, FixedKLController, OffPolicyParams, kl_reward_penalty
from thermik.algorithms.off_policy import off_policy_weights
from thermik.algorithms.shaping import length_penalty, overlong_penalty, select_groups, zero_variance_rows


def test_zero_variance_rows() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0])
    assert zero_variance_rows(rewards, torch.tensor([0, 0, 1, 1, 2])).tolist() == [False, False, True, True, True]


def test_dynamic_sampling_filter_and_replace() -> None:
    # groups (in order of appearance): 3 has signal, 1 flat, 8 has signal, 5 singleton (flat), 6 has signal
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 2.0, 7.0, 0.0, 1.0])
    group_ids = torch.tensor([3, 3, 1, 1, 8, 8, 5, 6, 6])
    picks = select_groups(rewards, group_ids, target_groups=2, mode="filter")
    # keep the first two groups with signal (3 and 8), relabelled 0 and 1
    assert picks == [(0, 0), (1, 0), (4, 1), (5, 1)]
    picks = select_groups(rewards, group_ids, target_groups=5, mode="filter")
    assert [g for _, g in picks] == [0, 0, 1, 1, 2, 2]  # only three have signal: the caller samples more
    picks = select_groups(rewards, group_ids, target_groups=5, mode="replace")
    # five groups: 3, 8, 6 then copies of 3 and 8 under fresh ids 3 and 4
    assert picks == [(0, 0), (1, 0), (4, 1), (5, 1), (7, 2), (8, 2), (0, 3), (1, 3), (4, 4), (5, 4)]
    assert select_groups(torch.ones(4), torch.tensor([0, 0, 1, 1]), 2, "replace") == []
    with pytest.raises(ValueError, match="'filter' or 'replace'"):
        select_groups(rewards, group_ids, 2, "drop")


def test_dapo_soft_overlong_penalty() -> None:
    # max 10, buffer 4: free up to 6 tokens, then linear to -1 at 10, -1 beyond
    lengths = torch.tensor([5, 6, 8, 10, 12])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4, factor=0.5)[2], torch.tensor(-0.25))
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(lengths, 10, 11)


def test_kimi_length_penalty() -> None:
    group_ids = torch.tensor([0, 0, 0, 1, 1])
    lengths = torch.tensor([2, 4, 6, 3, 3])
    # group 0: lambda = 0.5 - (len - 2) / 4 = 0.5, 0, -0.5 ; group 1 equal lengths -> 0
    out = length_penalty(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0]), group_ids, lengths, coef=1.0)
    torch.testing.assert_close(out, torch.tensor([0.5, 0.0, -0.5, 0.0, 0.0]))
    # an incorrect short answer gets min(0, 0.5) = 0, not a bonus
    out = length_penalty(torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0]), group_ids, lengths, coef=0.2)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.1, 0.0, 0.0]))


def test_kl_reward_penalty_and_controllers() -> None:
    out = kl_reward_penalty(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 2.0]]), torch.tensor([[0.0, 1.0]]), 0.1)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.8]]))  # off-mask KL is ignored
    fixed = FixedKLController(0.1)
    assert fixed.update(5.0, 64) == 0.1
    # Ziegler: e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon
    up = AdaptiveKLController(0.1, target=0.1, horizon=100)
    assert up.update(0.2, 10) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))  # e = 1 -> clipped to 0.2
    down = AdaptiveKLController(0.1, target=0.1, horizon=100)
    assert down.update(0.09, 10) == pytest.approx(0.1 * (1 - 0.1 * 10 / 100))  # e = -0.1
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target=0.1, horizon=0)


def _logps(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    rollout = torch.full((len(ratios), len(ratios[0])), -1.0)
    return rollout + torch.tensor(ratios).log(), rollout


def test_tis_and_mis_token_level() -> None:
    old, rollout = _logps([[2.0, 0.5, 1.5]])
    mask = torch.ones(1, 3)
    w, m = off_policy_weights(old, rollout, mask, OffPolicyParams(mode="tis", cap=1.5))
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 1.5]]))  # min(rho, 1.5)
    assert m["off_policy/corrected_frac"] == pytest.approx(1 / 3)
    # k3 mismatch: rho - 1 - ln rho = 0.3068528, 0.1931472, 0.0945349 -> mean 0.1981783
    assert m["off_policy/mismatch_kl"] == pytest.approx(0.1981783, abs=1e-6)
    w, m = off_policy_weights(old, rollout, mask, OffPolicyParams(mode="mis", low=0.6, high=1.8))
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1.5]]))  # 2 > 1.8 and 0.5 < 0.6 dropped
    assert m["off_policy/corrected_frac"] == pytest.approx(2 / 3)


def test_sequence_level_product_and_geometric() -> None:
    old, rollout = _logps([[2.0, 0.5, 1.5], [2.0, 2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # 9.0 sits off the mask
    params = OffPolicyParams(mode="tis", level="sequence", form="product", cap=3.0)
    w, _ = off_policy_weights(old, rollout, mask, params)
    # product: row 0 = 2 * 0.5 * 1.5 = 1.5 ; row 1 = 2 * 2 = 4 -> capped at 3 ; 0 off the mask
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [3.0, 3.0, 0.0]]))
    params = OffPolicyParams(mode="tis", level="sequence", form="geometric", cap=3.0)
    w, _ = off_policy_weights(old, rollout, mask, params)
    # geometric: row 0 = 1.5 ** (1/3) = 1.1447142 ; row 1 = (2 * 2) ** (1/2) = 2
    torch.testing.assert_close(w, torch.tensor([[1.1447142] * 3, [2.0, 2.0, 0.0]]))
    params = OffPolicyParams(mode="mis", level="sequence", form="product", low=0.5, high=2.0)
    w, m = off_policy_weights(old, rollout, mask, params)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [0.0, 0.0, 0.0]]))  # row 1 (4 > 2) dropped
    assert m["off_policy/corrected_frac"] == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="modes: none, mis, tis"):
        off_policy_weights(old, rollout, mask, OffPolicyParams(mode="tis", level="prefix"))


def test_no_correction_reports_mismatch_only() -> None:
    old, rollout = _logps([[math.e, 1.0]])
    w, m = off_policy_weights(old, rollout, torch.tensor([[1.0, 0.0]]), OffPolicyParams())
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0]]))
    assert set(m) == {"off_policy/mismatch_kl"} and m["off_policy/mismatch_kl"] == pytest.approx(math.e - 2, abs=1e-5)
