"""The critic of PPO with GAE: the clipped value loss by hand, the value model, and a real `thermik rl` run."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import pytest
import torch
from test_algorithms_rl import letter_env, stopping_model_dir  # noqa: F401  (fixtures, used by name)

from tests.conftest import short_rl_config
from thermik.algorithms.reductions import token_mean
from thermik.algorithms.value_loss import clipped_value_loss
from thermik.config.schema import CriticConfig, ModelConfig, OptimizerConfig
from thermik.runs.local import run_rl, setup
from thermik.training.batch import TokenBatch
from thermik.training.critic import Critic
from thermik.training.run_checkpoint import CRITIC_DIR

# token 0: unclipped branch wins; token 1: the clipped branch wins (gradient cut); token 2: v = old; token 3 masked
VALUES = [[1.0, 1.0, 0.5, 7.0]]
OLD = [[0.5, 0.5, 0.5, 0.0]]
RETURNS = [[0.0, 2.0, 1.0, -3.0]]
MASK = [[1.0, 1.0, 1.0, 0.0]]


def _loss(value_clip: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    v = torch.tensor(VALUES, requires_grad=True)
    loss, m = clipped_value_loss(
        v, torch.tensor(OLD), torch.tensor(RETURNS), torch.tensor(MASK), value_clip, partial(token_mean, normalizer=3)
    )
    loss.backward()
    assert v.grad is not None
    return loss, v.grad, m


def test_clipped_value_loss_hand_values() -> None:
    # token 0: max((1-0)^2, (0.7-0)^2) = 1; token 1: max((1-2)^2, (0.7-2)^2) = 1.69 (clipped); token 2: 0.25
    loss, grad, m = _loss(0.2)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.69 + 0.25) / 3)
    assert grad[0].tolist() == pytest.approx([1 / 3, 0.0, -0.5 / 3, 0.0])  # d/dv 0.5(v-R)^2 / 3; cut; masked
    assert m["critic/clip_frac"] == pytest.approx(1 / 3)
    assert m["critic/value_mean"] == pytest.approx(2.5 / 3) and m["critic/return_mean"] == pytest.approx(1.0)


def test_value_clip_zero_is_plain_squared_error() -> None:
    loss, grad, m = _loss(0.0)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.0 + 0.25) / 3)
    assert grad[0].tolist() == pytest.approx([1 / 3, -1 / 3, -0.5 / 3, 0.0])
    assert m["critic/clip_frac"] == 0.0
    with pytest.raises(ValueError, match="value_clip must be >= 0"):
        clipped_value_loss(*(torch.zeros(1, 2) for _ in range(4)), -1.0, token_mean)


def _batch(width: int = 6) -> TokenBatch:
    ids = torch.arange(2 * width).reshape(2, width) % 50 + 3
    mask = torch.zeros(2, width - 1)
    mask[:, 2:] = 1
    zeros = torch.zeros(2, width - 1)
    return TokenBatch(ids, torch.ones_like(ids), mask, zeros, zeros.clone(), group_ids=torch.tensor([0, 0]))


def test_critic_starts_at_zero_learns_and_checkpoints(tiny_model_dir, tmp_path) -> None:
    cfg = CriticConfig(value_clip=0.0, optimizer=OptimizerConfig(lr=3e-3))
    critic = Critic.from_config(ModelConfig(path=str(tiny_model_dir)), cfg, micro_batch_size=1)
    batch = _batch()
    batch.values = critic.values(batch)
    assert batch.values.abs().max() == 0  # zero head: every value starts at 0
    batch.returns = torch.where(batch.mask.bool(), 0.7, 0.0)
    losses = []
    for _ in range(6):
        batch.values = critic.values(batch)
        losses.append(critic.update(batch)["critic/loss"])
    assert losses[0] == pytest.approx(0.5 * 0.7**2)
    assert losses[-1] < 0.5 * losses[0]
    critic.save(tmp_path / "c")
    other = Critic.from_config(ModelConfig(path=str(tiny_model_dir)), cfg, micro_batch_size=1)
    other.load(tmp_path / "c")
    assert torch.equal(other.values(batch), critic.values(batch))
    assert other.optimizer.state_dict()["state"][0]["step"] == 6
    with pytest.raises(FileNotFoundError, match="written without a critic"):
        other.load(tmp_path)


@pytest.mark.slow
def test_ppo_with_gae_runs_end_to_end_and_resumes_the_critic(tmp_path, stopping_model_dir, letter_env) -> None:  # noqa: F811
    cfg = short_rl_config(
        tmp_path,
        stopping_model_dir,
        "gae",
        letter_env,
        train_rows=64,
        eval_rows=4,
        trainer={"steps": 6, "prompts_per_step": 2, "group_size": 4},
        algorithm={"advantage": {"type": "gae", "lam": 0.95}},
        critic={"mini_batches": 2, "optimizer": {"lr": 3e-3}},
        checkpoint={"every": 3},
        eval={"size": 2, "before": False},
        monitor={"progress": False, "save_trajectories_every": 0},
    )
    run_rl(cfg)
    lines = [json.loads(x) for x in (tmp_path / "gae" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "critic/loss" in x]
    assert len(steps) == 6
    # The critic is trained every step (that it learns is pinned above on a fixed batch: 6 sampled steps of
    # near-zero rewards are too noisy for a loss trend): its zero-initialised head moves off zero once a step has a
    # reward (a step whose rewards and values are all 0 has returns 0 and an exactly zero value-loss gradient).
    assert steps[0]["critic/value_mean"] == 0
    first = next(i for i, s in enumerate(steps) if s["reward/mean"] != 0)
    assert all(s["critic/grad_norm"] > 0 for s in steps[first:])
    assert all(s["critic/value_mean"] != 0 for s in steps[first + 1 :])
    assert all(s["advantage/abs_mean"] > 0 for s in steps[first:])
    ckpt = tmp_path / "gae" / "checkpoints" / "step_6" / CRITIC_DIR
    run = setup(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 7})}))
    try:
        critic = run.learner.critic
        assert run.start_step == 6 and critic is not None
        saved = Critic.from_config(cfg.model, cfg.critic, 16)
        saved.load(ckpt)
        for (name, p), q in zip(critic.model.state_dict().items(), saved.model.state_dict().values(), strict=True):
            assert torch.equal(p, q), name
        assert critic.model.head.weight.abs().sum() > 0  # trained, not the fresh zero head
        assert critic.optimizer.state_dict()["state"][0]["step"] == 12  # 6 RL steps x 2 mini-batches
    finally:
        asyncio.run(run.close())
