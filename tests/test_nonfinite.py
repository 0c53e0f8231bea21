"""NaN/inf in a reward, a rollout logprob or a gradient is caught through the real learner and update on
the tiny model: the step is skipped (nothing moves) or the run halts (`algorithm.health.on_nonfinite`), naming the
culprit."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from conftest import short_rl_config
from test_algorithms_update import _batch

from thermik.algorithms.health import NonFiniteGuard, NonFiniteLossError, nonfinite_entries
from thermik.models.loading import load_model, load_tokenizer
from thermik.training.learner import build_learner, train_on_batch


def _learner(tmp_path, model_dir, on_nonfinite: str, max_steps: int = 3):
    algorithm = {"health": {"on_nonfinite": on_nonfinite, "max_nonfinite_steps": max_steps}, "entropy_coef": 0.01}
    cfg = short_rl_config(tmp_path, model_dir, "nan", "reverse_text", algorithm=algorithm)
    return build_learner(cfg, load_model(str(model_dir)), load_tokenizer(str(model_dir)))


def _params(learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.policy.parameters()]


def _train(learner, batch):
    return asyncio.run(train_on_batch(learner, batch, 0, asynchronous=False))[0]


def _poisoned(culprit: str):
    batch = _batch()
    if culprit == "reward":
        batch.token_rewards[1, 4] = math.nan
    else:
        batch.rollout_logp[2, 5] = -math.inf  # row 2's tokens 2..9 are trained
    return batch


@pytest.mark.parametrize(("culprit", "key"), [("reward", "rewards"), ("rollout logprob", "rollout_logprobs")])
def test_a_nonfinite_input_skips_the_update_then_fails_the_run(tmp_path, tiny_model_dir, culprit, key):
    learner = _learner(tmp_path, tiny_model_dir, "skip", max_steps=2)
    before = _params(learner)
    with pytest.warns(RuntimeWarning, match=f"1 {culprit} value"):
        metrics = _train(learner, _poisoned(culprit))
    assert metrics == {f"health/nonfinite_{key}": 1.0, "health/skipped_update": 1.0}
    assert all(torch.equal(a, b) for a, b in zip(before, learner.policy.parameters(), strict=True))
    with pytest.raises(NonFiniteLossError, match=f"2 consecutive updates .*{culprit}"):
        _train(learner, _poisoned(culprit))


@pytest.mark.parametrize("culprit", ["reward", "rollout logprob"])
def test_halt_stops_at_the_first_nonfinite_input_naming_it(tmp_path, tiny_model_dir, culprit):
    learner = _learner(tmp_path, tiny_model_dir, "halt")
    with pytest.raises(NonFiniteLossError, match=f"1 {culprit} value\\(s\\), the first at sample \\d.*on_nonfinite"):
        _train(learner, _poisoned(culprit))


def test_a_nonfinite_logprob_outside_the_loss_mask_is_not_a_culprit(tmp_path, tiny_model_dir):
    learner = _learner(tmp_path, tiny_model_dir, "halt")
    batch = _batch()
    batch.rollout_logp[1, 12] = math.nan  # row 1 is 6 tokens long: position 12 is padding
    metrics = _train(learner, batch)
    assert "health/skipped_update" not in metrics and metrics["health/skipped_steps"] == 0


def test_a_nonfinite_gradient_names_the_parameter(tmp_path, tiny_model_dir):
    learner = _learner(tmp_path, tiny_model_dir, "halt")
    name, param = next((n, p) for n, p in learner.policy.named_parameters() if "mlp" in n)
    param.register_hook(lambda grad: grad * math.nan)
    with pytest.raises(NonFiniteLossError, match=f"gradient \\(first in {name}\\)"):
        _train(learner, _batch())


def test_guard_and_entries_by_hand():
    values = torch.tensor([[0.0, 1.0, math.inf], [math.nan, 2.0, 3.0]])
    assert nonfinite_entries("x", values) == (2, "2 x value(s), the first at sample 0 token 2: inf")
    assert nonfinite_entries("x", values, where=torch.tensor([[1, 1, 0], [0, 1, 1]]))[0] == 0
    guard = NonFiniteGuard(2)
    assert guard.ok(1.0, 1.0) and not guard.ok(math.nan, 1.0) and guard.ok(1.0, 1.0)  # a good step resets
    with pytest.raises(NonFiniteLossError, match="halt"):
        NonFiniteGuard(5, halt=True).ok(1.0, math.inf)
