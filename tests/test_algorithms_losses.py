"""Policy losses against values computed by hand: the loss, its gradient wrt logp, and the cut/capped share."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest
import torch

from thermik.algorithms import (
    POLICY_LOSS_PARAMS,
    POLICY_LOSSES,
    aipo_loss,
    cispo_loss,
    clip_cov_loss,
    cross_entropy_loss,
    dppo_kl_loss,
    dppo_loss,
    dual_clip_loss,
    gspo_loss,
    importance_sampling_loss,
    ipo_loss,
    kl_cov_loss,
    policy_loss,
    ppo_clip_loss,
    sapo_loss,
    token_mean,
)
from thermik.algorithms.cov_losses import ClipCovParams, KlCovParams
from thermik.algorithms.custom import CustomParams
from thermik.algorithms.is_losses import CispoParams, RatioCapParams
from thermik.algorithms.losses import ClipParams, DppoParams, DualClipParams, NoParams, SapoParams

OLD = -1.0


def _inputs(ratios: list[list[float]], adv: list[list[float]], mask: list[list[float]] | None = None):
    """old_logp = -1 everywhere; logp = old + log(ratio) as a leaf with gradient."""
    r = torch.tensor(ratios, dtype=torch.float64)
    old = torch.full_like(r, OLD)
    logp = (old + r.log()).requires_grad_(True)
    a = torch.tensor(adv, dtype=torch.float64)
    m = torch.ones_like(r) if mask is None else torch.tensor(mask, dtype=torch.float64)
    return logp, old, a, m


NAMES = {fn: name for name, fn in POLICY_LOSSES.items()}


def _run(fn, inputs, params=None):
    """fn on inputs with `params`, or the loss's default parameters."""
    logp, old, adv, mask = inputs
    params = POLICY_LOSS_PARAMS[NAMES[fn]]() if params is None else params
    loss, metrics = fn(logp, old, adv, mask, params, token_mean)
    loss.backward()
    return loss.item(), logp.grad, metrics


def _close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=0)


def test_dual_clip_bounds_negative_advantages() -> None:
    inputs = _inputs([[3.0, 0.5, 1.0], [3.0, 1.0, 1.0]], [[-1.0] * 3, [1.0] * 3])
    loss, grad, m = _run(dual_clip_loss, inputs, DualClipParams(clip_ratio_c=2.0))
    # A=-1: r=3 -> PPO 3, dual bound c|A| = 2 -> 2 (no gradient) ; r=0.5 -> PPO -min(-0.5, -0.8) = 0.8 (clipped low);
    # r=1 -> 1. A=+1: r=3 -> -1.28 (clipped high) ; r=1 -> -1, -1. Mean over 6: (2 + 0.8 + 1 - 1.28 - 2) / 6
    assert loss == pytest.approx(0.52 / 6)
    _close(grad, [[0.0, 0.0, 1 / 6], [0.0, -1 / 6, -1 / 6]])
    assert m["policy/clip_frac_dual"] == pytest.approx(1 / 6)
    assert m["policy/clip_frac"] == pytest.approx(3 / 6)
    # plain PPO leaves the first token unbounded: 3 instead of 2
    assert ppo_clip_loss(*inputs[:2], inputs[2], inputs[3], ClipParams(), token_mean)[0].item() == pytest.approx(
        1.52 / 6
    )
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _run(dual_clip_loss, inputs, DualClipParams(clip_ratio_c=1.0))


def test_gspo_sequence_ratio_and_equal_token_gradients() -> None:
    logp_minus_old = [[0.1, 0.3, 0.0], [-0.1, 0.1, 0.0]]
    ratios = [[math.exp(x) for x in row] for row in logp_minus_old]
    inputs = _inputs(ratios, [[1.0] * 3, [-1.0] * 3], [[1, 1, 0], [1, 1, 0]])
    loss, grad, m = _run(gspo_loss, inputs)
    # row 0: s = exp(mean(0.1, 0.3)) = exp(0.2) = 1.2214 > 1 + 4e-4 with A > 0 -> clipped: -1.0004 per token, no grad
    # row 1: s = exp(0) = 1 -> 1 per token; d/dlogp_t = -A * s = 1, the same for both tokens (PPO would give
    # exp(-0.1) and exp(0.1)). Token mean over 4: (-1.0004 * 2 + 2) / 4 = -0.0002
    assert loss == pytest.approx(-0.0002)
    _close(grad, [[0.0, 0.0, 0.0], [0.25, 0.25, 0.0]])
    assert m["policy/clip_frac"] == pytest.approx(0.5)
    assert m["policy/ratio_mean"] == pytest.approx((2 * math.exp(0.2) + 2) / 4)


def test_cispo_clips_the_weight_not_the_gradient() -> None:
    inputs = _inputs([[2.0, 0.5, 1.0]], [[1.0, 1.0, -1.0]])
    loss, grad, m = _run(cispo_loss, inputs, CispoParams(clip_low=1.0, clip_high=0.5))
    # weights clamp(r, 0, 1.5) = 1.5, 0.5, 1 ; logp = -1 + ln r = -0.3068528, -1.6931472, -1
    # loss = -(1.5 * -0.3068528 + 0.5 * -1.6931472 - 1 * -1) / 3 = 0.3068528 / 3
    assert loss == pytest.approx(0.3068528 / 3)
    # gradient -w * A / 3: the capped token still learns (PPO would give it 0)
    _close(grad, [[-0.5, -1 / 6, 1 / 3]])
    assert m["policy/clip_frac"] == pytest.approx(1 / 3)


def test_sapo_soft_gate() -> None:
    inputs = _inputs([[1.0, 2.0]], [[1.0, -1.0]])
    loss, grad, m = _run(sapo_loss, inputs, SapoParams(tau_pos=1.0, tau_neg=2.0))
    # r=1, A=+1, tau 1: f = 4 sigmoid(0) = 2 -> -2 ; f'(1) = 1 so d/dlogp = -A * r = -1 (plain policy gradient)
    # r=2, A=-1, tau 2: f = 2 sigmoid(2) = 1.7615942 -> +1.7615942 ; f'(r) = 4 s (1 - s) = 0.4199743 with
    # s = sigmoid(2) = 0.8807971 -> d/dlogp = -A f'(r) r = 0.8399486 (PPO's clip would give 0 here only for r<0.8)
    assert loss == pytest.approx((-2 + 1.7615942) / 2)
    _close(grad, [[-0.5, 0.8399486 / 2]])
    assert m["policy/clip_frac"] == 0.0


def test_dppo_masks_on_probability_difference() -> None:
    old_p = torch.tensor([[0.5, 0.5, 0.5, 0.5, 0.01]], dtype=torch.float64)
    new_p = torch.tensor([[0.8, 0.6, 0.2, 0.45, 0.02]], dtype=torch.float64)
    logp = new_p.log().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    loss, m = dppo_loss(logp, old_p.log(), adv, torch.ones_like(adv), DppoParams(), token_mean)
    loss.backward()
    # d = p - p_old: +0.3 (A>0, > 0.2: blocked), +0.1 (ok), -0.3 (A<0, blocked), -0.05 (ok), +0.01 (ok: a rare token
    # doubling its probability moves little mass, though its ratio 2 is far outside PPO's clip)
    # loss per token -r A: 0, -1.2, 0, +0.9, -2 -> mean -2.3 / 5
    assert loss.item() == pytest.approx(-2.3 / 5)
    _close(logp.grad, [[0.0, -1.2 / 5, 0.0, 0.9 / 5, -2 / 5]])
    assert m["policy/clip_frac"] == pytest.approx(2 / 5)


def test_dppo_kl_binary_kl_mask() -> None:
    old_p = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    logp = torch.tensor([[0.8, 0.6]], dtype=torch.float64).log().requires_grad_(True)
    adv = torch.ones(1, 2, dtype=torch.float64)
    loss, m = dppo_kl_loss(logp, old_p.log(), adv, torch.ones_like(adv), DppoParams(), token_mean)
    # KL_b(0.5 || 0.8) = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231436 > 0.2: blocked ;
    # KL_b(0.5 || 0.6) = 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = 0.0204110: kept -> loss = -1.2 / 2
    assert loss.item() == pytest.approx(-0.6)
    assert m["policy/clip_frac"] == pytest.approx(0.5)


def test_ipo_and_aipo_cap_the_ratio() -> None:
    params = RatioCapParams(ratio_cap=2.0)
    loss, grad, m = _run(ipo_loss, _inputs([[3.0, 0.5]], [[1.0, -1.0]]), params)
    # ipo: -min(3, 2) * 1 = -2 (capped: no gradient) ; -min(0.5, 2) * -1 = 0.5 (gradient -A r = 0.5) ; mean -0.75
    assert loss == pytest.approx(-0.75)
    _close(grad, [[0.0, 0.25]])
    assert m["policy/clip_frac"] == pytest.approx(0.5)
    loss, grad, _ = _run(aipo_loss, _inputs([[3.0, 0.5]], [[1.0, -1.0]]), params)
    # aipo: weights sg(min(r, 2)) = 2, 0.5 ; logp = -1 + ln 3 = 0.0986123, -1 + ln 0.5 = -1.6931472
    # loss = (-2 * 1 * 0.0986123 - 0.5 * -1 * -1.6931472) / 2 = -0.5218991 ; gradient -w A / 2 = -1, 0.25
    assert loss == pytest.approx(-0.5218991)
    _close(grad, [[-1.0, 0.25]])
    with pytest.raises(ValueError, match="ratio_cap"):
        _run(ipo_loss, _inputs([[1.0]], [[1.0]]), RatioCapParams(ratio_cap=0.0))


def test_importance_sampling_and_cross_entropy() -> None:
    loss, grad, _ = _run(importance_sampling_loss, _inputs([[3.0, 0.5]], [[1.0, -1.0]]))
    # (-3 * 1 - 0.5 * -1) / 2 = -1.25 ; gradient -A r / 2 = -1.5, 0.25 (no clip at all)
    assert loss == pytest.approx(-1.25)
    _close(grad, [[-1.5, 0.25]])
    logp = torch.tensor([[-1.0, -2.0, float("-inf")]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss_t, _ = cross_entropy_loss(logp, logp.detach(), torch.full_like(mask, 5.0), mask, NoParams(), token_mean)
    loss_t.backward()
    # mean of -logp over the two mask tokens = 1.5, advantages ignored; the -inf padding does not leak
    assert loss_t.item() == pytest.approx(1.5)
    _close(logp.grad, [[-0.5, -0.5, 0.0]])


def _cov_inputs(diff: list[float]):
    # logp -0.5, -2, -3, -2.5 (mean -2) and A = 2, 0, -2, 0 (mean 0): cov = 2*1.5 = 3, 0, -2*-1 = 2, 0
    logp = torch.tensor([[-0.5, -2.0, -3.0, -2.5]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor([diff], dtype=torch.float64)
    adv = torch.tensor([[2.0, 0.0, -2.0, 0.0]], dtype=torch.float64)
    return logp, old, adv, torch.ones_like(adv)


def test_clip_cov_cuts_gradient_of_highest_covariance_tokens() -> None:
    loss, grad, m = _run(clip_cov_loss, _cov_inputs([0.0] * 4), ClipCovParams(fraction=0.25))
    # ratio 1: per token -A = -2, 0, 2, 0 -> loss 0 ; k = max(1, int(0.25 * 4)) = 1 token with cov in (1, 5):
    # the largest, token 0 (cov 3), loses its gradient ; token 2 keeps -A / 4 = 0.5
    assert loss == pytest.approx(0.0)
    _close(grad, [[0.0, 0.0, 0.5, 0.0]])
    assert m["policy/cov_clip_frac"] == pytest.approx(0.25)
    _, grad, _ = _run(clip_cov_loss, _cov_inputs([0.0] * 4), ClipCovParams(fraction=0.25, cov_high=2.5))
    # with the band (1, 2.5) token 0 (cov 3) is not eligible: token 2 (cov 2) is cut instead
    _close(grad, [[-0.5, 0.0, 0.0, 0.0]])


def test_kl_cov_penalises_highest_covariance_tokens() -> None:
    loss, _, m = _run(kl_cov_loss, _cov_inputs([0.1, 0.0, -0.2, 0.0]), KlCovParams(fraction=0.25, coef=1.0))
    # -r A: -2 e^0.1 = -2.2103418, 0, 2 e^-0.2 = 1.6374615, 0 ; token 0 (cov 3) adds 1 * |0.1|
    assert loss == pytest.approx((-2.2103418 + 0.1 + 1.6374615) / 4)
    assert m["policy/kl_cov_frac"] == pytest.approx(0.25)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_same_signature_shapes_and_masked_garbage(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 1, generator=g, dtype=torch.float64).expand(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    with torch.no_grad():
        old[0, 4] = float("nan")  # padding garbage off the mask
    loss, m = policy_loss(name)(logp, old, adv, mask, POLICY_LOSS_PARAMS[name](), token_mean)
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert torch.isfinite(logp.grad).all() and torch.all(logp.grad[mask == 0] == 0)
    assert {"policy/clip_frac", "policy/ratio_mean", "policy/ratio_std"} <= set(m)
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        policy_loss(name)(logp, old, adv[:, :2], mask, POLICY_LOSS_PARAMS[name](), token_mean)


def test_custom_loss_from_import_path(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_losses.py").write_text(
        textwrap.dedent(
            """
            def half_pg(logp, old_logp, adv, mask, params, reduce):
                return reduce(-0.5 * adv * logp, mask), {"policy/clip_frac": 0.0}

            def wrong(logp, adv):
                return 0
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_losses", None)
    fn = policy_loss("custom", "my_losses:half_pg")
    logp = torch.tensor([[-1.0, -2.0]])
    loss, _ = fn(logp, logp, torch.ones(1, 2), torch.ones(1, 2), CustomParams(), token_mean)
    assert loss.item() == pytest.approx(0.75)  # -0.5 * (-1 - 2) / 2
    with pytest.raises(ValueError, match=r"package\.module:function"):
        policy_loss("custom", "my_losses.half_pg")
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod'"):
        policy_loss("custom", "no_such_mod:f")
    with pytest.raises(ValueError, match="no callable 'missing'"):
        policy_loss("custom", "my_losses:missing")
    with pytest.raises(ValueError, match="must accept"):
        policy_loss("custom", "my_losses:wrong")


def test_custom_loss_config_needs_its_path() -> None:
    from pydantic import ValidationError

    from thermik.config.schema import AlgorithmConfig

    with pytest.raises(ValidationError, match=r"loss.custom.path\n  Field required"):
        AlgorithmConfig(loss={"type": "custom"})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        AlgorithmConfig(loss={"type": "ppo", "path": "pkg.mod:fn"})
    loss = AlgorithmConfig(loss={"type": "custom", "path": "pkg.mod:fn", "options": {"beta": 0.5}}).loss
    assert (loss.path, loss.options) == ("pkg.mod:fn", {"beta": 0.5})
