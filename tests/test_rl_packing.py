"""The RL forward packs rows where the shared-prompt forward does not apply: same logprobs, entropies and update."""

from __future__ import annotations

import copy

import pytest
import torch

from thermik.config.schema import AlgorithmConfig, OptimizerConfig, TrainerConfig
from thermik.models.loading import load_model
from thermik.rollout.trajectory import Trajectory
from thermik.training import update
from thermik.training.batch import collate
from thermik.training.loss import LossSetup
from thermik.training.optim import build_optimizer


def _batch(distinct_prompts: bool):
    """8 rows of mixed lengths (prompts 4..11, responses 2..30), one group per prompt or groups of 4."""
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(3, 150, (n,), generator=g).tolist()  # noqa: E731
    shared = ids(12)
    trajs = []
    for i in range(8):
        prompt = ids(4 + i) if distinct_prompts else shared
        n = (2, 30, 3, 25, 4, 5, 28, 2)[i]
        group = i if distinct_prompts else i // 4
        trajs.append(
            Trajectory(prompt_ids=prompt, response_ids=ids(n), loss_mask=[1] * n, rollout_logprobs=[-1.0] * n,
                       rewards=[0.0] * (n - 1) + [float(i % 2)], group_id=group)
        )  # fmt: skip
    batch = collate(trajs, None, pad_id=0)
    batch.adv = (torch.arange(8, dtype=torch.float32)[:, None] - 3.5) * batch.mask / 4
    return batch


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_packed_rows_give_the_padded_logprobs_and_gradients(tiny_model_dir, monkeypatch, shared_prefix):
    model = load_model(tiny_model_dir)
    batch = _batch(distinct_prompts=True)  # no prompt shared: the shared-prompt forward steps aside
    calls = []
    real = update.packed_token_logprobs
    monkeypatch.setattr(update, "packed_token_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    results = []
    for packing in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = update.batch_logprobs(model, batch, 1.0, shared_prefix, packing=packing)
        (-(logp * batch.adv).sum() / batch.num_tokens).backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((logp, entropy, grad))
    assert calls == [1], "the packed forward ran once (packing on), the padded one otherwise"
    on = batch.mask.bool()
    (logp0, ent0, grad0), (logp1, ent1, grad1) = results
    torch.testing.assert_close(logp1[on], logp0[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent1[on], ent0[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(grad1, grad0, rtol=1e-4, atol=1e-6)


def test_rows_that_would_not_pack_tighter_stay_padded(tiny_model_dir):
    model = load_model(tiny_model_dir)
    batch = _batch(distinct_prompts=True).slice(0, 1)
    assert update.packed_rows_logprobs(model, batch, 1.0, False) is None


def test_a_policy_update_on_packed_rows_equals_the_padded_update(tiny_model_dir):
    base = load_model(tiny_model_dir)
    weights = []
    for packing in (False, True):
        model = copy.deepcopy(base)
        trainer = TrainerConfig(
            shared_prefix=False, packing=packing, micro_batch_size=4, optimizer=OptimizerConfig(lr=1e-3)
        )
        optimizer, scheduler = build_optimizer(model, trainer.optimizer)
        setup = LossSetup.from_config(AlgorithmConfig(), trainer, 1.0)
        metrics = update.policy_update(model, None, _batch(distinct_prompts=False), setup, optimizer, scheduler)
        assert metrics["health/skipped_steps"] == 0
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    # AdamW divides by sqrt(v): gradients equal to float rounding move a weight by < 1% of its 1e-3 step apart
    torch.testing.assert_close(weights[1], weights[0], rtol=0, atol=2e-5)
    assert float((weights[1] - base_flat(base)).abs().max()) > 5e-4, "the update moved the weights"


def base_flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])
