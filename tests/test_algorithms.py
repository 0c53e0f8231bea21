"""Algorithms against hand-computed values (the expected numbers are worked out in the comments)."""

from __future__ import annotations

import math
import subprocess
import sys
from functools import partial
from typing import get_args

import pytest
import torch

from thermik.algorithms import (
    ClipParams,
    broadcast_to_tokens,
    dr_grpo_advantages,
    entropy_from_logits,
    entropy_from_logprobs,
    get,
    grpo_advantages,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
    ppo_clip_loss,
    sequence_mean,
    token_mean,
)
from thermik.algorithms.registry import POLICY_LOSSES
from thermik.config.algorithm import AdvantageConfig, AlgorithmConfig, KLConfig, ReductionConfig
from thermik.config.variants import variant_models

# ---------------------------------------------------------------- advantages


def test_grpo_groups_singletons_and_equal_rewards() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 5.0, 5.0])
    group_ids = torch.tensor([0, 0, 0, 0, 7, 3, 3])
    adv, metrics = grpo_advantages(rewards, group_ids, std_eps=0.0)
    # group 0: mean 0.5, population std 0.5 -> +-1; group 7 is a singleton -> 0; group 3 all equal -> 0 (no NaN
    # even with eps = 0)
    assert torch.equal(adv, torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0]))
    assert metrics["advantage/zero_std_frac"] == pytest.approx(2 / 3)
    assert metrics["advantage/num_groups"] == 3


def test_grpo_uses_population_std() -> None:
    adv, _ = grpo_advantages(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([4, 4, 4]), std_eps=1e-6)
    # mean 1, population variance (1 + 0 + 1) / 3 = 2/3, std 0.8164966 -> +-1 / (0.8164966 + 1e-6) = +-1.2247433
    # (the unbiased std would be 1 and give +-1)
    torch.testing.assert_close(adv, torch.tensor([-1.2247433, 0.0, 1.2247433]), atol=1e-6, rtol=0)


def test_grpo_equal_float_rewards_are_exactly_zero() -> None:
    # 0.1 has no exact binary form: the group mean can differ from 0.1 by rounding; dividing that by eps
    # would give noise of order 1e-2. The estimator must return exact zeros instead.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.7])
    adv, _ = grpo_advantages(rewards, torch.tensor([1, 1, 1, 2, 2]))
    assert torch.equal(adv[:3], torch.zeros(3))
    # group 2: mean 0.5, std 0.2 -> -+0.2 / 0.200001
    torch.testing.assert_close(adv[3:], torch.tensor([-0.999995, 0.999995]), atol=1e-5, rtol=0)


def test_dr_grpo_does_not_divide_by_std() -> None:
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 1.0, 0.0, 1.0, 0.0])
    group_ids = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2])
    adv, metrics = dr_grpo_advantages(rewards, group_ids)
    # group 0: mean 1 -> -1, 0, 1; group 1 singleton -> 0; group 2: mean 0.5 -> +-0.5
    assert torch.equal(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.5, -0.5, 0.5, -0.5]))
    assert metrics["advantage/zero_std_frac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("estimator", [grpo_advantages, dr_grpo_advantages])
def test_advantage_input_errors(estimator) -> None:
    with pytest.raises(ValueError, match="group_ids"):
        estimator(torch.ones(3), torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"rewards \[N\]"):
        estimator(torch.ones(3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="NaN"):
        estimator(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))


def test_broadcast_to_tokens() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]))
    with pytest.raises(ValueError):
        broadcast_to_tokens(torch.tensor([1.0]), mask)


# ---------------------------------------------------------------- reductions


def test_reductions_hand_values() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # token mean: (1 + 2 + 3 + 4) / 4 = 2.5 ; NaN/inf sit on masked positions and must not leak
    assert token_mean(x, mask).item() == pytest.approx(2.5)
    assert token_mean(x, mask, normalizer=10.0).item() == pytest.approx(1.0)
    # sequence mean: (mean(1, 2, 3) + mean(4)) / 2 = (2 + 4) / 2 = 3 ; with 4 sequences in the mini-batch: 6 / 4
    assert sequence_mean(x, mask).item() == pytest.approx(3.0)
    assert sequence_mean(x, mask, num_sequences=4).item() == pytest.approx(1.5)
    with pytest.raises(ValueError, match="normalizer"):
        token_mean(x, mask, normalizer=0.0)
    with pytest.raises(ValueError, match="shape"):
        token_mean(x, mask[:, :2])


def _ppo_minibatch(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    n, t = 6, 7
    logp = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    old_logp = logp + 0.4 * torch.randn(n, t, generator=g, dtype=torch.float64)
    adv = torch.randn(n, 1, generator=g, dtype=torch.float64).expand(n, t)
    lengths = torch.tensor([7, 2, 5, 1, 6, 3])  # very different lengths make a wrong reduction visible
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(torch.float64)
    return logp, old_logp, adv, mask


def _grad(logp, old_logp, adv, mask, reduce, splits) -> torch.Tensor:
    leaf = logp.clone().requires_grad_(True)
    start = 0
    for size in splits:
        sl = slice(start, start + size)
        loss, _ = ppo_clip_loss(leaf[sl], old_logp[sl], adv[sl], mask[sl], ClipParams(), reduce(sl))
        loss.backward()
        start += size
    assert leaf.grad is not None
    return leaf.grad


@pytest.mark.parametrize("splits", [[2, 2, 2], [1, 4, 1], [3, 3]])
def test_microbatch_gradient_invariance(splits: list[int]) -> None:
    logp, old_logp, adv, mask = _ppo_minibatch()
    total_tokens = float(mask.sum())
    num_seqs = mask.shape[0]
    reductions = {
        "token_mean": lambda sl: partial(token_mean, normalizer=total_tokens),
        "sequence_mean": lambda sl: partial(sequence_mean, num_sequences=num_seqs),
    }
    for reduce in reductions.values():
        full = _grad(logp, old_logp, adv, mask, reduce, [num_seqs])
        split = _grad(logp, old_logp, adv, mask, reduce, splits)
        assert full.abs().sum() > 0
        torch.testing.assert_close(split, full, atol=1e-6, rtol=0)


def test_local_normalizer_breaks_invariance() -> None:
    # The failure the explicit normalizer prevents: averaging per-micro-batch token means.
    logp, old_logp, adv, mask = _ppo_minibatch()
    full = _grad(logp, old_logp, adv, mask, lambda sl: token_mean, [6])
    split = _grad(logp, old_logp, adv, mask, lambda sl: lambda x, m: token_mean(x, m) / 3, [2, 2, 2])
    assert (split - full).abs().max() > 1e-3


# ---------------------------------------------------------------- PPO clip


def test_ppo_clip_both_sides_both_signs() -> None:
    ratios = torch.tensor([[1.0, 1.5, 0.5, 1.0], [1.5, 0.5, 1.1, 1.0]], dtype=torch.float64)
    old_logp = torch.full((2, 4), -1.0, dtype=torch.float64)
    logp = (old_logp + ratios.log()).requires_grad_(True)
    with torch.no_grad():
        logp[0, 3] = -math.inf  # padding garbage on a masked token
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.float64)
    loss, m = ppo_clip_loss(logp, old_logp, adv, mask, ClipParams(clip_low=0.2, clip_high=0.28), token_mean)
    # A=+1: r=1 -> -1; r=1.5 -> -min(1.5, 1.28) = -1.28 (clipped high); r=0.5 -> -min(0.5, 0.8) = -0.5 (not clipped)
    # A=-1: r=1.5 -> -min(-1.5, -1.28) = 1.5 (not clipped); r=0.5 -> -min(-0.5, -0.8) = 0.8 (clipped low); r=1.1 -> 1.1
    # token mean over 6 tokens: (-1 - 1.28 - 0.5 + 1.5 + 0.8 + 1.1) / 6 = 0.62 / 6 = 0.1033333
    assert loss.item() == pytest.approx(0.62 / 6)
    assert m["policy/clip_frac"] == pytest.approx(2 / 6)
    assert m["policy/clip_frac_high"] == pytest.approx(1 / 6)
    assert m["policy/clip_frac_low"] == pytest.approx(1 / 6)
    # ratios 1, 1.5, 0.5, 1.5, 0.5, 1.1: mean 6.1 / 6 = 1.0166667; E[r^2] = 7.21 / 6 = 1.2016667,
    # var = 1.2016667 - 1.0336111 = 0.1680556, std = 0.4099458
    assert m["policy/ratio_mean"] == pytest.approx(6.1 / 6)
    assert m["policy/ratio_std"] == pytest.approx(0.4099458, abs=1e-6)
    loss.backward()
    # d/dlogp of -r*A / 6 = -A*r / 6 where unclipped, 0 where the clip is active or the token is masked
    expected = torch.tensor([[-1 / 6, 0.0, -0.5 / 6, 0.0], [1.5 / 6, 0.0, 1.1 / 6, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_ppo_symmetric_clip_differs_from_clip_higher() -> None:
    ratio = torch.tensor([[1.25]])
    args = (ratio.log(), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    # r = 1.25, A = 1: with clip_high 0.2 the objective is capped at 1.2; with 0.28 it is 1.25
    assert ppo_clip_loss(*args, ClipParams(clip_high=0.2), token_mean)[0].item() == pytest.approx(-1.2)
    assert ppo_clip_loss(*args, ClipParams(clip_high=0.28), token_mean)[0].item() == pytest.approx(-1.25)


def test_ppo_bad_input() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        ppo_clip_loss(x, x, x[:, :2], x, ClipParams(), token_mean)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_clip_loss(x, x, x, x, ClipParams(clip_low=1.5), token_mean)


# ---------------------------------------------------------------- KL and entropy


def test_kl_estimators_hand_values() -> None:
    logp = torch.tensor([[math.log(0.5), -1.0]])
    ref = torch.tensor([[math.log(0.25), -1.0]])
    # log_r = ref - logp = log(0.5) = -0.6931472 on the first token, 0 on the second
    torch.testing.assert_close(kl_k1(logp, ref), torch.tensor([[0.6931472, 0.0]]))
    torch.testing.assert_close(kl_k2(logp, ref), torch.tensor([[0.2402265, 0.0]]))  # 0.6931472^2 / 2
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([[0.1931472, 0.0]]))  # 0.5 + 0.6931472 - 1
    torch.testing.assert_close(kl_abs(logp, ref), torch.tensor([[0.6931472, 0.0]]))


def test_kl_k3_clamps_log_ratio() -> None:
    logp = torch.tensor([[0.0, -100.0]])
    ref = torch.tensor([[-100.0, 0.0]])
    # log_r = -100 -> -10: exp(-10) + 10 - 1 = 9.0000454 ; log_r = 100 -> 10: exp(10) - 10 - 1 = 22015.4658
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([[9.0000454, 22015.4658]]))
    with pytest.raises(ValueError, match="shape"):
        kl_k3(logp, ref[:, :1])


def test_entropy_from_logits() -> None:
    logits = torch.stack([torch.zeros(4), torch.tensor([math.log(0.5), math.log(0.25), math.log(0.25), -1e4])]).view(
        1, 2, 4
    )
    # uniform over 4: ln 4 = 1.3862944 ; (0.5, 0.25, 0.25, ~0): 0.5 ln 2 + 2 * 0.25 ln 4 = 1.0397208
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[1.3862944, 1.0397208]]))
    out = entropy_from_logits(logits.to(torch.bfloat16))
    assert out.dtype == torch.float32 and out.shape == (1, 2)
    with pytest.raises(ValueError):
        entropy_from_logits(logits[0])
    torch.testing.assert_close(entropy_from_logprobs(torch.log_softmax(logits, -1)), entropy_from_logits(logits))


# ---------------------------------------------------------------- registry


def test_registry_lookup_and_errors() -> None:
    assert get("advantage", "grpo") is grpo_advantages
    assert get("reduction", "token_mean") is token_mean
    assert get("kl", "k3") is kl_k3
    with pytest.raises(ValueError, match="dr_grpo, gae, grpo"):
        get("advantage", "ppo")
    with pytest.raises(ValueError, match="advantage, kl, policy_loss, reduction"):
        get("losses", "ppo")


def test_every_config_choice_is_registered() -> None:
    sections = [
        (AdvantageConfig, "type", "advantage"),
        (ReductionConfig, "type", "reduction"),
        (KLConfig, "estimator", "kl"),
    ]
    for section, field, table in sections:
        for name in get_args(section.model_fields[field].annotation):
            assert callable(get(table, name))
    losses = variant_models(AlgorithmConfig.model_fields["loss"].annotation)
    assert set(losses) == set(POLICY_LOSSES) | {"custom"}  # custom: loaded from algorithm.loss.path


def test_algorithms_import_no_heavy_backends() -> None:
    code = "import sys, thermik.algorithms; bad = {'transformers', 'pydantic'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)
