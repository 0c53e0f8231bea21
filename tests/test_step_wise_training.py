"""Rewards, advantages and loss reductions when one episode trains as several rows (rollout.step_wise).

The rule (docs/algorithms.md, 'Step-wise trajectories'): every row of an episode scores the episode's return and
GRPO's groups are counted in episodes; per-sequence reductions weigh episodes, not rows, so splitting an episode
into samples changes no episode's weight.
"""

from __future__ import annotations

import pytest
import torch
from test_algorithms_rl import stopping_model_dir  # noqa: F401 (a fixture)

from thermik.algorithms.advantages import grpo_advantages
from thermik.algorithms.episodes import episode_row_weights, returns_to_go
from thermik.config.schema import AlgorithmConfig, RunConfig, TrainerConfig
from thermik.rollout.trajectory import Trajectory
from thermik.training.batch import TokenBatch, collate
from thermik.training.batch_advantages import assign_advantages
from thermik.training.loss import LossSetup, mini_batch_reduction


def sample(prompt: list[int], sampled: list[int], reward: float, group: int = 0) -> Trajectory:
    rewards = [0.0] * len(sampled)
    rewards[-1] = reward
    n = len(sampled)
    return Trajectory(
        prompt, list(sampled), [1] * n, [-0.5] * n, [0] * n, rewards, group_id=group, turn_spans=[(0, n, n)]
    )


def episode(*samples: Trajectory) -> Trajectory:
    head = samples[0]
    head.continuations = list(samples[1:])
    return head


def batch_of_three() -> list[Trajectory]:
    """Group 0: episode A in two samples (0.2 then 0.8 on its turns), B and C one sample each, return 0."""
    a = episode(sample([1, 2], [3, 4, 5], 0.2), sample([1, 9], [6, 7], 0.8))
    return [a, sample([1, 2], [3, 3], 0.0), sample([1, 2], [4, 4, 4, 4], 0.0)]


def test_collate_flattens_samples_with_episode_and_group_ids() -> None:
    batch = collate(batch_of_three(), None, 0)
    assert batch.episode_ids.tolist() == [0, 0, 1, 2] and batch.group_ids.tolist() == [0, 0, 0, 0]
    assert batch.mask.sum(dim=-1).tolist() == [3, 2, 2, 4]


def test_grpo_groups_episodes_and_gives_every_step_the_episode_advantage() -> None:
    batch = collate(batch_of_three(), None, 0)
    assign_advantages(batch, AlgorithmConfig(advantage={"type": "grpo"}), max_response_length=64)
    expected, _ = grpo_advantages(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), 1e-6)
    per_row = [batch.adv[r][batch.mask[r].bool()].unique().tolist() for r in range(4)]
    assert per_row == [[pytest.approx(expected[0].item())]] * 2 + [[pytest.approx(expected[1].item())]] * 2
    # Counted in rows, A would be two of four samples: a different baseline.
    rows, _ = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]), 1e-6)
    assert rows[0].item() != pytest.approx(expected[0].item())


def test_per_step_rewards_score_each_row_by_its_return_to_go() -> None:
    assert returns_to_go(torch.tensor([0.2, 0.8, 0.0, 1.0, -1.0]), torch.tensor([0, 0, 1, 2, 2])).tolist() == (
        pytest.approx([1.0, 0.8, 0.0, 0.0, -1.0])
    )
    batch = collate(batch_of_three(), None, 0)
    assign_advantages(
        batch, AlgorithmConfig(advantage={"type": "grpo", "step_rewards": "per-step"}), max_response_length=64
    )
    expected, _ = grpo_advantages(torch.tensor([1.0, 0.8, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]), 1e-6)
    assert [batch.adv[r][batch.mask[r].bool()][0].item() for r in range(4)] == pytest.approx(expected.tolist())


def _split_and_whole() -> tuple[TokenBatch, TokenBatch, torch.Tensor, torch.Tensor]:
    """The same episodes and per-token loss values twice: episode 0 as two rows (3 + 2 tokens), and as one row."""
    split = collate(batch_of_three(), None, 0)
    whole = collate([sample([1, 2], [3, 4, 5, 6, 7], 1.0), *batch_of_three()[1:]], None, 0)
    values = torch.arange(1.0, 12.0)  # one loss value per sampled token, in episode order
    x_split, x_whole = torch.zeros_like(split.mask), torch.zeros_like(whole.mask)
    x_split[split.mask.bool()] = values
    x_whole[whole.mask.bool()] = values
    return split, whole, x_split, x_whole


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean", "prompt_mean", "seq_mean_token_sum_norm"])
def test_reductions_weigh_an_episode_the_same_whether_split_or_not(reduction: str) -> None:
    setup = LossSetup.from_config(AlgorithmConfig(reduction={"type": reduction}), TrainerConfig(), temperature=1.0)
    split, whole, x_split, x_whole = _split_and_whole()
    value_split = mini_batch_reduction(setup, split)(0, len(split))(x_split, split.mask)
    value_whole = mini_batch_reduction(setup, whole)(0, len(whole))(x_whole, whole.mask)
    assert value_split.item() == pytest.approx(value_whole.item())
    # Micro-batches of the split batch add up to the mini-batch's value (the reduction is bound to its counts).
    bound = mini_batch_reduction(setup, split)
    parts = sum(bound(s, s + 1)(x_split[s : s + 1], split.mask[s : s + 1]) for s in range(len(split)))
    assert parts.item() == pytest.approx(value_split.item())


def test_sequence_mean_by_hand() -> None:
    """Episode means 3.0 (1..5), 6.5 (6, 7), 9.5 (8..11), averaged over 3 episodes."""
    setup = LossSetup.from_config(
        AlgorithmConfig(reduction={"type": "sequence_mean"}), TrainerConfig(), temperature=1.0
    )
    split, _, x_split, _ = _split_and_whole()
    value = mini_batch_reduction(setup, split)(0, len(split))(x_split, split.mask)
    assert value.item() == pytest.approx((3.0 + 6.5 + 9.5) / 3)
    weights = episode_row_weights(split.episode_ids, split.mask.sum(dim=-1))
    assert weights.tolist() == pytest.approx([3 / 5 / 3, 2 / 5 / 3, 1 / 3, 1 / 3])


def test_a_rewriting_context_policy_needs_step_wise_samples() -> None:
    from pydantic import ValidationError

    from thermik.config.schema import RolloutConfig

    with pytest.raises(ValidationError, match=r"rollout\.step_wise 'on-break'"):
        RolloutConfig(step_wise="off", context="summarise")
    assert RolloutConfig().step_wise == "on-break" and RolloutConfig().context == "truncate-episode"


@pytest.mark.slow
def test_an_rl_step_trains_episodes_of_several_samples(tmp_path, stopping_model_dir) -> None:  # noqa: F811
    """The real loop (engine, math_feedback env, learner) with Qwen3's thinking rules and enable_thinking = false:
    the generation prompt's empty <think> block leaves the history, so each feedback turn starts a new sample."""
    import json

    from test_algorithms_rl import _metrics

    from thermik.data.dataset import write_rows
    from thermik.models.chat import QWEN3_THINKING_TEMPLATE
    from thermik.runs.local import run_rl
    from thermik.tasks.registry import generate_rows

    template = tmp_path / "qwen3_thinking.jinja"
    template.write_text(QWEN3_THINKING_TEMPLATE)
    write_rows(tmp_path / "train.jsonl", generate_rows("math_feedback", 8, 0, split="train"))
    write_rows(tmp_path / "eval.jsonl", generate_rows("math_feedback", 2, 0, split="eval"))
    cfg = RunConfig.model_validate(
        {
            "name": "algos",
            "output_dir": str(tmp_path),
            "model": {"path": str(stopping_model_dir), "chat_template": str(template), "enable_thinking": False},
            "env": {"name": "math_feedback", "max_turns": 2},
            "data": {"train_path": str(tmp_path / "train.jsonl"), "eval_path": str(tmp_path / "eval.jsonl")},
            "rollout": {"max_generate_length": 12, "max_input_length": 256, "max_sequence_length": 320},
            "trainer": {"steps": 1, "prompts_per_step": 2, "group_size": 4},
            "algorithm": {"reduction": {"type": "sequence_mean"}},
            "eval": {"size": 2, "before": False},
            "monitor": {"progress": False, "save_trajectories_every": 1},
        }
    )
    run_rl(cfg)
    (metrics,) = _metrics(tmp_path)
    episodes = [json.loads(x) for x in (tmp_path / "algos" / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    two_turns = [e for e in episodes if e["num_turns"] == 2]
    assert two_turns and all(len(e["continuations"]) == 1 for e in two_turns)
    assert metrics["step_wise/samples_per_episode"] == pytest.approx(1 + len(two_turns) / len(episodes))
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("policy/"))
