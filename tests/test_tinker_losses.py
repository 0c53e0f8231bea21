"""Tinker's losses by name, summed as Tinker defines them, against hand-written per-token formulas."""

from __future__ import annotations

import pytest
import torch

from thermik.tinker.losses import LossError, compute_loss, required_inputs

LOGP = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -3.0, 0.0]])
OLD = torch.tensor([[-1.2, -0.4, -2.0], [-0.5, -1.0, 0.0]])
ADV = torch.tensor([[1.0, -1.0, 2.0], [0.5, 1.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the second datum is one token shorter (padding)


def _rl(name: str, **config: float) -> float:
    logp = LOGP.clone().requires_grad_(True)
    result = compute_loss(name, config, logp, {"logprobs": OLD, "advantages": ADV}, MASK)
    return result.loss.item()


def _sum(per_token: torch.Tensor) -> float:
    return float((per_token * MASK).sum())


def test_cross_entropy_is_the_weighted_sum_of_negative_logprobs() -> None:
    weights = torch.tensor([[1.0, 0.0, 0.5], [2.0, 1.0, 1.0]])
    result = compute_loss("cross_entropy", {}, LOGP, {"weights": weights}, MASK)
    assert result.loss.item() == pytest.approx(_sum(-LOGP * weights))
    assert result.per_token[1, 2].item() == 0.0  # padding carries nothing


def test_importance_sampling_ppo_cispo_dro_match_their_formulas() -> None:
    ratio = torch.exp(LOGP - OLD)
    assert _rl("importance_sampling") == pytest.approx(_sum(-ratio * ADV))
    clipped = torch.minimum(ratio * ADV, ratio.clamp(0.8, 1.2) * ADV)
    assert _rl("ppo") == pytest.approx(_sum(-clipped))
    wide = torch.minimum(ratio * ADV, ratio.clamp(0.5, 1.5) * ADV)
    assert _rl("ppo", clip_low_threshold=0.5, clip_high_threshold=1.5) == pytest.approx(_sum(-wide))
    assert _rl("cispo") == pytest.approx(_sum(-ratio.clamp(0.8, 1.2) * ADV * LOGP))
    beta = 0.3
    assert _rl("dro", beta=beta) == pytest.approx(_sum(-(ADV * LOGP - 0.5 * beta * (LOGP - OLD) ** 2)))


def test_gradients_follow_the_sum() -> None:
    logp = LOGP.clone().requires_grad_(True)
    compute_loss("importance_sampling", {}, logp, {"logprobs": OLD, "advantages": ADV}, MASK).loss.backward()
    torch.testing.assert_close(logp.grad, -torch.exp(LOGP - OLD) * ADV * MASK)


def test_other_thermik_losses_by_name_and_refusals() -> None:
    assert _rl("aipo", ratio_cap=2.0) == pytest.approx(_sum(-torch.exp(LOGP - OLD).clamp(max=2.0) * ADV * LOGP))
    assert required_inputs("cross_entropy") == ("target_tokens",)
    with pytest.raises(LossError, match="unknown loss_fn 'nope'; valid: "):
        required_inputs("nope")
    with pytest.raises(LossError, match="needs loss_fn_config\\['beta'\\]"):
        _rl("dro")
    with pytest.raises(LossError, match="not understood"):
        _rl("ppo", temperature=2.0)


@pytest.fixture(scope="module")
def bench():
    from tests.conftest import load_benchmark

    yield from load_benchmark("tinker_overhead")


def test_overhead_benchmark_reports_the_ratio(bench) -> None:
    result = bench.OverheadResult(sdk_s=0.15, local_s=0.1, steps=10, batch=8, tokens=512)
    text = bench.format_result(result)
    assert "ratio SDK/in-process: 1.50x (overhead 50.0 ms/step)" in text and "batch 8 x 64 tokens" in text
    with pytest.raises(SystemExit):
        bench.parse_args(["--threads", "0"])
