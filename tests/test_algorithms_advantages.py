"""Advantage estimators against values computed by hand (worked out in the comments)."""

from __future__ import annotations

import pytest
import torch

from thermik.algorithms import (
    AdvantageContext,
    discounted_returns,
    dr_grpo_advantages,
    gae_advantages,
    gae_advantages_and_returns,
    get,
    grpo_advantages,
    maxrl_advantages,
    opo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    to_tokens,
)


def _close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_rloo_leave_one_out_singletons_and_equal_rewards() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 5.0, 5.0, 3.0, 1.0, 2.0])
    group_ids = torch.tensor([0, 0, 0, 0, 7, 3, 3, 4, 4, 4])
    adv, metrics = rloo_advantages(rewards, group_ids)
    # group 0: r=1 -> 1 - mean(0, 0, 1) = 2/3 ; r=0 -> 0 - mean(1, 0, 1) = -2/3 ; singleton 7 -> 0 ;
    # group 3 all equal -> 0 ; group 4: 3 - mean(1, 2) = 1.5, 1 - mean(3, 2) = -1.5, 2 - mean(3, 1) = 0
    _close(adv, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 1.5, -1.5, 0.0])
    assert metrics["advantage/zero_std_frac"] == pytest.approx(2 / 4)


def test_maxrl_mean_normalised_weights_hard_prompts_up() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3])
    adv, _ = maxrl_advantages(rewards, group_ids, std_eps=0.0)
    # group 0: pass rate 0.25 -> (1 - 0.25) / 0.25 = 3, (0 - 0.25) / 0.25 = -1 ; group 1: mean 0.5 -> +-1 ;
    # group 2 all wrong and group 3 all right -> 0 (no division by a zero mean)
    _close(adv, [3.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    # GRPO would give the hard group's success only (1 - 0.25) / 0.4330127 = 1.7320508
    assert grpo_advantages(rewards, group_ids, 0.0)[0][0].item() == pytest.approx(1.7320508)


def test_opo_length_weighted_baseline() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 3.0, 1.0, 0.0])
    group_ids = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    lengths = torch.tensor([2, 4, 6, 5, 1, 9, 0, 0])
    adv, _ = opo_advantages(rewards, group_ids, ctx=AdvantageContext(lengths=lengths))
    # group 0: b = (2*1 + 4*0 + 6*0) / 12 = 1/6 -> 5/6, -1/6, -1/6 (a plain mean would give 1/3) ; group 1 equal -> 0 ;
    # singleton -> 0 ; group 3 has no tokens at all -> falls back to the mean 0.5 -> +-0.5
    _close(adv, [5 / 6, -1 / 6, -1 / 6, 0.0, 0.0, 0.0, 0.5, -0.5])
    mask = (torch.arange(6)[None, :] < lengths[:3, None]).float()
    adv_from_mask, _ = opo_advantages(rewards[:3], group_ids[:3], ctx=AdvantageContext(mask=mask))
    _close(adv_from_mask, [5 / 6, -1 / 6, -1 / 6])
    with pytest.raises(ValueError, match="opo needs response lengths"):
        opo_advantages(rewards, group_ids)


def test_discounted_returns_skip_observation_tokens() -> None:
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    # row 0: the observation token (mask 0) is skipped: G = [0.5 * 1, 0, 1] ; row 1: [0.5 * 2, 2, 0]
    _close(discounted_returns(token_rewards, mask, gamma=0.5), [[0.5, 0.0, 1.0], [1.0, 2.0, 0.0]])


def test_reinforce_pp_global_normalisation() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5])
    group_ids = torch.tensor([0, 1, 2])  # all singletons: REINFORCE++ needs no group
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv, _ = reinforce_pp_advantages(rewards, group_ids, 0.0, ctx=AdvantageContext(mask=mask))
    # rewards on each row's last mask token, gamma 1: returns on mask tokens 1, 1 | 0, 0 | 0.5 ;
    # mean 0.5, population var (4 * 0.25 + 0) / 5 = 0.2, std 0.4472136 -> +-1.118034, 0
    _close(adv, [[1.118034, 1.118034, 0.0], [0.0, -1.118034, -1.118034], [0.0, 0.0, 0.0]])
    adv, _ = reinforce_pp_advantages(rewards, group_ids, 0.0, ctx=AdvantageContext(mask=mask, gamma=0.5))
    # returns 0.5, 1 | 0, 0 | 0.5 ; mean 0.4, var (0.01 + 0.36 + 0.16 + 0.16 + 0.01) / 5 = 0.14, std 0.3741657
    _close(adv[0], [0.2672612, 1.6035675, 0.0])
    # without a mask each sequence is one token: rewards 1, 0, 0.5 -> mean 0.5, std 0.4082483 -> +-1.2247449, 0
    _close(reinforce_pp_advantages(rewards, group_ids, 0.0)[0], [1.2247449, -1.2247449, 0.0])
    flat, _ = reinforce_pp_advantages(torch.full((3,), 0.7), group_ids, ctx=AdvantageContext(mask=mask))
    assert torch.equal(flat, torch.zeros(3, 3))


def test_reinforce_pp_baseline_group_mean_then_global_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 2.0, 0.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, _ = reinforce_pp_baseline_advantages(rewards, group_ids, 0.0)
    # centred: 0.5, -0.5, 0, 0, 1, -1 ; population std over sequences sqrt(2.5 / 6) = 0.6454972 ; not re-centred
    _close(adv, [0.7745967, -0.7745967, 0.0, 0.0, 1.5491933, -1.5491933])
    lengths = torch.tensor([1, 3, 1, 1, 2, 2])
    mask = (torch.arange(3)[None, :] < lengths[:, None]).float()
    adv, _ = reinforce_pp_baseline_advantages(rewards, group_ids, 0.0, ctx=AdvantageContext(mask=mask))
    # over 10 tokens: 0.5 x1, -0.5 x3, 0 x2, 1 x2, -1 x2 ; mean -0.1 ; E[x^2] = 5 / 10 -> var 0.49, std 0.7
    _close(adv[:2], [[0.7142857, 0.0, 0.0], [-0.7142857, -0.7142857, -0.7142857]])
    _close(adv[4], [1.4285714, 1.4285714, 0.0])


def test_gae_hand_values_and_returns() -> None:
    token_rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = gae_advantages_and_returns(token_rewards, values, mask, gamma=1.0, lam=1.0)
    # deltas (from the end): 1 - 0.7 = 0.3 ; 0.7 - 0.6 = 0.1 ; 0.6 - 0.5 = 0.1 -> A = 0.5, 0.4, 0.3 ; R = A + V = 1
    _close(adv, [[0.5, 0.4, 0.3]])
    _close(ret, [[1.0, 1.0, 1.0]])
    adv, ret = gae_advantages_and_returns(token_rewards, values, mask, gamma=0.9, lam=0.5)
    # t2: 0.3 ; t1: delta 0.9 * 0.7 - 0.6 = 0.03, A = 0.03 + 0.45 * 0.3 = 0.165 ; t0: 0.9 * 0.6 - 0.5 = 0.04,
    # A = 0.04 + 0.45 * 0.165 = 0.11425
    _close(adv, [[0.11425, 0.165, 0.3]])
    _close(ret, [[0.61425, 0.765, 1.0]])


def test_gae_bootstraps_across_observation_tokens() -> None:
    token_rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.7]])  # 9.0 sits on an observation token and must be ignored
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    adv, ret = gae_advantages_and_returns(token_rewards, values, mask, gamma=1.0, lam=1.0)
    # t2: 1 - 0.7 = 0.3 ; t0 bootstraps from t2: 0.7 - 0.5 + 0.3 = 0.5
    _close(adv, [[0.5, 0.0, 0.3]])
    _close(ret, [[1.0, 0.0, 1.0]])


def test_gae_estimator_whitens_and_needs_a_critic() -> None:
    mask = torch.ones(1, 3)
    ctx = AdvantageContext(mask=mask, values=torch.tensor([[0.5, 0.6, 0.7]]))
    adv, _ = gae_advantages(torch.tensor([1.0]), torch.tensor([0]), 0.0, ctx=ctx)
    # raw A = 0.5, 0.4, 0.3: mean 0.4, population std 0.0816497 -> 1.2247449, 0, -1.2247449
    _close(adv, [[1.2247449, 0.0, -1.2247449]])
    with pytest.raises(ValueError, match="critic values"):
        gae_advantages(torch.tensor([1.0]), torch.tensor([0]), ctx=AdvantageContext(mask=mask))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "opo", "maxrl"])
def test_every_estimator_same_call_zero_for_equal_rewards(name: str) -> None:
    # One call shape for all; equal rewards within every group (and a singleton) -> exactly 0 everywhere.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.3, 0.9])
    group_ids = torch.tensor([0, 0, 0, 1, 1, 2])
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 6)
    if name in ("reinforce_pp",):  # global estimators see the batch, not groups: give the whole batch one value
        rewards = torch.full((6,), 0.1)
    adv, metrics = get("advantage", name)(rewards, group_ids, 1e-6, ctx=AdvantageContext(mask=mask))
    assert torch.equal(to_tokens(adv, mask), torch.zeros(6, 3))
    assert metrics["advantage/num_groups"] == 3


def test_grpo_and_dr_grpo_unchanged_by_context() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0])
    group_ids = torch.tensor([0, 0, 0, 0, 7])
    ctx = AdvantageContext(mask=torch.ones(5, 2), lengths=torch.tensor([1, 2, 3, 4, 5]), gamma=0.5)
    for fn in (grpo_advantages, dr_grpo_advantages):
        assert torch.equal(fn(rewards, group_ids, 1e-6, ctx=ctx)[0], fn(rewards, group_ids, 1e-6)[0])
    assert torch.equal(grpo_advantages(rewards, group_ids, 0.0)[0], torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0]))


def test_to_tokens_broadcasts_or_masks() -> None:
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    _close(to_tokens(torch.tensor([2.0, -1.0]), mask), [[2.0, 0.0], [-1.0, -1.0]])
    _close(to_tokens(torch.tensor([[1.0, 5.0], [2.0, 3.0]]), mask), [[1.0, 0.0], [2.0, 3.0]])
    with pytest.raises(ValueError, match="do not match"):
        to_tokens(torch.zeros(2, 3), mask)
