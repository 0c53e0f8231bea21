"""The trainer side of the algorithms through the real `policy_update` on the tiny model: reductions independent
of the micro-batch split, off-policy weights, KL modes, reference refresh, NaN/Inf and degenerate-ratio health."""

from __future__ import annotations

import copy
import sys
import textwrap
from functools import partial

import pytest
import torch

from thermik.algorithms import prompt_mean, prompt_weights, seq_mean_token_sum_norm
from thermik.algorithms.health import DegenerateRatioDetector, DegenerateRatioError, NonFiniteGuard, NonFiniteLossError
from thermik.config.schema import AlgorithmConfig, TrainerConfig
from thermik.models.loading import load_model
from thermik.training.batch import TokenBatch
from thermik.training.batch_advantages import assign_advantages
from thermik.training.loss import LossSetup
from thermik.training.reference import maybe_refresh
from thermik.training.update import logprobs_no_grad, policy_update


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is faster, and far faster when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir) -> torch.nn.Module:
    return load_model(str(tiny_model_dir))


def _batch(seed: int = 0, n: int = 6, width: int = 14) -> TokenBatch:
    """Right-padded random sequences of very different lengths, a prompt of 3 tokens, groups of 2-3-1."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([14, 6, 11, 5, 9, 13])[:n]
    input_ids = torch.randint(3, 200, (n, width), generator=g)
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention
    mask = torch.zeros(n, width - 1)
    for i, length in enumerate(lengths.tolist()):
        mask[i, 2 : length - 1] = 1.0
    adv = torch.randn(n, 1, generator=g).expand(n, width - 1) * mask
    rollout_logp = -torch.rand(n, width - 1, generator=g) * 4 * mask
    token_rewards = torch.zeros(n, width - 1)
    group_ids = torch.tensor([0, 0, 1, 1, 1, 2])[:n]
    return TokenBatch(input_ids, attention, mask, rollout_logp, adv, token_rewards=token_rewards, group_ids=group_ids)


def _grads_after_update(policy, batch, alg, micro, mini_batches=1, lr=0.0, **kw) -> tuple[torch.Tensor, dict]:
    model = copy.deepcopy(policy)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    trainer = TrainerConfig(micro_batch_size=micro, mini_batches=mini_batches)
    trainer = trainer.model_copy(update={"optimizer": trainer.optimizer.model_copy(update={"max_grad_norm": 1e9})})
    setup = LossSetup.from_config(alg, trainer, 1.0, kl_coef=kw.pop("kl_coef", None))
    metrics = policy_update(model, kw.pop("ref", None), batch, setup, opt, sched, **kw)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), metrics


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"])
def test_gradient_independent_of_micro_batch_split(tiny_policy, reduction: str) -> None:
    alg = AlgorithmConfig(reduction={"type": reduction, "constant": 16.0}, entropy_coef=0.01)
    batch = _batch()
    full, _ = _grads_after_update(tiny_policy, batch, alg, micro=6)
    assert full.abs().sum() > 0
    for micro in (1, 2):
        split, _ = _grads_after_update(tiny_policy, batch, alg, micro=micro)
        torch.testing.assert_close(split, full, atol=2e-6, rtol=1e-4)


def test_reductions_hand_values() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")], [6.0, 8.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    # Dr. GRPO: token sums 6, 4, 14 over a constant 10, mean over 3 sequences: 24 / 10 / 3 = 0.8 ; NaN/inf masked
    assert seq_mean_token_sum_norm(x, mask, constant=10.0).item() == pytest.approx(0.8)
    assert seq_mean_token_sum_norm(x, mask, num_sequences=6, constant=10.0).item() == pytest.approx(0.4)
    # prompt mean: sequence means 2, 4, 7 ; prompt 5 = (2 + 4) / 2 = 3, prompt 9 = 7 -> (3 + 7) / 2 = 5
    weights = prompt_weights(torch.tensor([5, 5, 9]))
    torch.testing.assert_close(weights, torch.tensor([0.25, 0.25, 0.5]))
    assert prompt_mean(x, mask, weights).item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="constant"):
        seq_mean_token_sum_norm(x, mask, constant=0.0)
    with pytest.raises(ValueError, match="seq_weights"):
        prompt_mean(x, mask, weights[:2])


def test_tis_scales_and_mis_drops_the_gradient(tiny_policy) -> None:
    batch = _batch()
    base, _ = _grads_after_update(tiny_policy, batch, AlgorithmConfig(), micro=3)
    # rollout logprobs ln 2 below the trainer's: rho = 2 on every token ; TIS cap 1.5 -> every weight 1.5
    with torch.no_grad():
        trainer_logp = logprobs_no_grad(tiny_policy, batch, 6, 1.0)
    batch.rollout_logp = (trainer_logp - torch.log(torch.tensor(2.0))) * batch.mask
    tis, m = _grads_after_update(tiny_policy, batch, AlgorithmConfig(correction={"type": "tis", "cap": 1.5}), micro=3)
    torch.testing.assert_close(tis, 1.5 * base, atol=1e-6, rtol=1e-4)
    assert m["off_policy/weight_mean"] == pytest.approx(1.5)
    assert m["off_policy/corrected_frac"] == pytest.approx(1.0)
    assert m["off_policy/mismatch_kl"] == pytest.approx(2 - 1 - torch.log(torch.tensor(2.0)).item(), abs=1e-5)
    # MIS keeps [0.5, 1.8]: rho = 2 is outside, every token dropped -> no policy gradient at all
    mis, m = _grads_after_update(tiny_policy, batch, AlgorithmConfig(correction={"type": "mis", "high": 1.8}), micro=3)
    assert mis.abs().max() == 0 and m["off_policy/corrected_frac"] == pytest.approx(1.0)


def test_kl_loss_estimator_selectable_and_reward_mode(tiny_policy) -> None:
    batch = _batch()
    ref = copy.deepcopy(tiny_policy)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    metrics = {}
    for est in ("k1", "k2", "k3", "abs"):
        _, metrics[est] = _grads_after_update(
            tiny_policy, batch, AlgorithmConfig(kl={"coef": 0.1, "estimator": est}), micro=6, ref=ref
        )
    # k2 = log_r^2 / 2 and abs = |log_r| differ in value; abs >= k1 (k1 may be negative per token)
    assert metrics["abs"]["policy/kl"] > 0 and metrics["abs"]["policy/kl"] >= metrics["k1"]["policy/kl"]
    assert metrics["k2"]["policy/kl"] != pytest.approx(metrics["k3"]["policy/kl"])
    # reward mode: no KL loss term in the update, the penalty reaches the advantages instead
    _, m = _grads_after_update(
        tiny_policy, batch, AlgorithmConfig(kl={"coef": 0.1, "mode": "reward"}), micro=6, ref=ref
    )
    assert "policy/kl" not in m


def test_kl_reward_mode_changes_advantages_by_hand() -> None:
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    batch = TokenBatch(
        torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), mask, torch.zeros(2, 3),
        torch.zeros(2, 3), token_rewards=token_rewards, group_ids=torch.tensor([0, 0]),
    )  # fmt: skip
    ref_logp = torch.tensor([[0.0, -0.5, -1.0], [0.0, -2.0, 0.0]])
    alg = AlgorithmConfig(advantage={"type": "dr_grpo"}, kl={"coef": 0.1, "mode": "reward", "estimator": "k1"})
    metrics = assign_advantages(batch, alg, max_response_length=8, ref_logp=ref_logp, kl_coef=0.1)
    # k1 = rollout - ref = 0.5, 1 (row 0) and 2 (row 1): returns 1 - 0.1 * 1.5 = 0.85 and 1 - 0.1 * 2 = 0.8
    # -> dr_grpo: mean 0.825 -> +0.025 / -0.025 on each row's tokens
    torch.testing.assert_close(batch.adv, torch.tensor([[0.0, 0.025, 0.025], [0.0, -0.025, 0.0]]))
    assert metrics["policy/kl"] == pytest.approx(3.5 / 3)


def test_reference_refresh_copy_and_ema(tiny_policy) -> None:
    policy, ref = copy.deepcopy(tiny_policy), copy.deepcopy(tiny_policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    first = next(ref.parameters()).detach().clone()
    alg = AlgorithmConfig(kl={"coef": 0.1}, reference={"update": "ema", "every": 2, "ema_alpha": 0.25})
    assert not maybe_refresh(ref, policy, alg, step=1)  # not a multiple of 2
    assert maybe_refresh(ref, policy, alg, step=2)
    torch.testing.assert_close(next(ref.parameters()), first + 0.25)  # (1 - 0.25) ref + 0.25 (ref + 1)
    copy_alg = AlgorithmConfig(kl={"coef": 0.1}, reference={"update": "copy", "every": 2})
    maybe_refresh(ref, policy, copy_alg, step=4)
    torch.testing.assert_close(next(ref.parameters()), next(policy.parameters()))
    assert not maybe_refresh(
        ref, policy, AlgorithmConfig(kl={"coef": 0.1}, reference={"update": "frozen", "every": 2}), step=4
    )


def test_nan_loss_skips_the_step_then_fails(tiny_policy, tmp_path, monkeypatch) -> None:
    (tmp_path / "nan_loss.py").write_text(
        textwrap.dedent(
            """
            def nan_loss(logp, old_logp, adv, mask, params, reduce):
                return reduce(logp * float("nan"), mask), {}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("nan_loss", None)
    alg = AlgorithmConfig(loss={"type": "custom", "path": "nan_loss:nan_loss"}, health={"max_nonfinite_steps": 2})
    guard = NonFiniteGuard(alg.health.max_nonfinite_steps)
    model = copy.deepcopy(tiny_policy)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    setup = LossSetup.from_config(alg, TrainerConfig(micro_batch_size=3), 1.0)
    update = partial(policy_update, model, None, _batch(), setup, opt, sched)
    metrics = update(guard=guard)
    assert metrics["health/skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # nothing moved
    with pytest.raises(NonFiniteLossError, match="2 consecutive optimizer steps"):
        update(guard=guard)


def test_degenerate_ratio_detected_through_the_update(tiny_policy) -> None:
    batch = _batch()
    # lr 0 with two mini-batches: the second mini-batch's ratio is 1 up to float rounding (the no-grad and the grad
    # forward may sum in another order on some CPUs) -> std ~0 although lr "should" move it
    _, frozen = _grads_after_update(tiny_policy, batch, AlgorithmConfig(), micro=3, mini_batches=2, lr=0.0)
    _, moving = _grads_after_update(tiny_policy, batch, AlgorithmConfig(), micro=3, mini_batches=2, lr=0.05)
    assert frozen["health/ratio_std_updated"] < 1e-5 and moving["health/ratio_std_updated"] > 1e-4
    warn = DegenerateRatioDetector(patience=2)
    assert not warn.observe(frozen["health/ratio_std_updated"], lr=1e-3)
    with pytest.warns(RuntimeWarning, match="do not change the policy"):
        assert warn.observe(frozen["health/ratio_std_updated"], lr=1e-3)
    assert not warn.observe(moving["health/ratio_std_updated"], lr=1e-3) and warn.streak == 0
    assert not warn.observe(None, lr=1e-3)  # one mini-batch: nothing measured, nothing concluded
    halt = DegenerateRatioDetector(patience=1, halt=True)
    with pytest.raises(DegenerateRatioError, match="halt_on_degenerate"):
        halt.observe(0.0, lr=1e-3)
    assert not DegenerateRatioDetector(patience=1, halt=True).observe(0.0, lr=0.0)  # lr 0: a std of 0 is expected
