"""The algorithm options wired through the real RL loop (engine, rollout, trainer) for two steps on the tiny model."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import torch

from thermik.config.schema import RunConfig
from thermik.data.dataset import write_rows
from thermik.envs.base import Env, StepOutput
from thermik.envs.registry import register, unregister
from thermik.models.loading import load_model
from thermik.runs.local import run_rl, setup
from thermik.tasks.registry import generate_rows


class LetterShareEnv(Env):
    """Single turn; reward = share of lowercase letters (~0.1 for the untrained model): groups almost always differ."""

    def __init__(self, reward_spec: dict, extra_info: dict, options: object) -> None:
        pass

    def step(self, action: str) -> StepOutput:
        return StepOutput([], sum("a" <= c <= "z" for c in action) / max(len(action), 1), True)


@pytest.fixture(scope="module")
def stopping_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with its end-of-turn logit raised to ~10% per token, so most 12-token episodes finish
    and earn a reward (a turn cut by max_generate_length earns 0, which would leave every group flat)."""
    out = tmp_path_factory.mktemp("stopping") / "model"
    shutil.copytree(tiny_model_dir, out)
    model = load_model(str(tiny_model_dir))
    ids = torch.randint(3, 200, (16, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1].flatten(0, 1).mean(0)
        stop_id = 258  # <|im_end|> of the preset tokenizer
        model.lm_head.weight[stop_id] = h / h.norm() ** 2 * 3.0  # mean logit 3 (the largest are ~3.2)
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture
def letter_env():
    register("letter_share", f"{__name__}:LetterShareEnv")
    yield "letter_share"
    unregister("letter_share")


def _config(tmp_path, model_dir, env: str, algorithm: dict, trainer: dict | None = None) -> RunConfig:
    write_rows(tmp_path / "train.jsonl", generate_rows("reverse_text", 32, 0, split="train"))
    write_rows(tmp_path / "eval.jsonl", generate_rows("reverse_text", 4, 0, split="eval"))
    return RunConfig.model_validate(
        {
            "name": "algos",
            "output_dir": str(tmp_path),
            "model": {"path": str(model_dir)},
            "env": {"name": env, "max_turns": 1},
            "data": {"train_path": str(tmp_path / "train.jsonl"), "eval_path": str(tmp_path / "eval.jsonl")},
            "rollout": {"max_generate_length": 12, "max_input_length": 128, "max_sequence_length": 160},
            "trainer": {"steps": 2, "prompts_per_step": 2, "group_size": 4, **(trainer or {})},
            "algorithm": algorithm,
            "eval": {"size": 2, "before": False},
            "monitor": {"progress": False, "save_trajectories_every": 0},
        }
    )


def _metrics(tmp_path) -> list[dict]:
    lines = [json.loads(x) for x in (tmp_path / "algos" / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "policy/loss" in x]


@pytest.mark.slow
def test_many_options_through_the_loop(tmp_path, stopping_model_dir, letter_env) -> None:
    algorithm = {
        "advantage": {"type": "rloo"},
        "loss": {"type": "cispo"},
        "reduction": {"type": "prompt_mean"},
        "kl": {"coef": 0.05, "mode": "reward", "controller": "adaptive", "horizon": 16},
        "reference": {"update": "ema", "every": 1},
        "correction": {"type": "tis"},
        "shaping": {
            "dynamic_sampling": "filter",
            "dynamic_sampling_max_rounds": 2,
            "zero_variance_mask": True,
            "overlong_buffer": 4,
            "length_penalty_coef": 0.1,
        },
    }
    cfg = _config(tmp_path, stopping_model_dir, letter_env, algorithm, {"mini_batches": 2, "micro_batch_size": 3})
    run_rl(cfg)
    steps = _metrics(tmp_path)
    assert len(steps) == 2
    for m in steps:
        assert 1 <= m["batch/rollout_rounds"] <= 3 and m["batch/groups_kept"] <= 2
        assert m["off_policy/weight_mean"] > 0 and "health/ratio_std_updated" in m
        assert m["policy/kl_coef"] != 0.05  # the adaptive controller moved it (KL measured in reward mode)
        assert m["health/skipped_steps"] == 0
    # the adaptive KL weight is checkpointed and a resumed run goes on from it
    state = json.loads((tmp_path / "algos" / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert state["extra"]["kl_coef"] == pytest.approx(steps[-1]["policy/kl_coef"])
    run = setup(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 3})}))
    try:
        assert run.start_step == 2 and run.learner.algo.kl.value == pytest.approx(steps[-1]["policy/kl_coef"])
    finally:
        asyncio.run(run.close())


@pytest.mark.slow
def test_replace_keeps_the_batch_full(tmp_path, stopping_model_dir, letter_env) -> None:
    algorithm = {
        "advantage": {"type": "maxrl"},
        "loss": {"type": "gspo"},
        "reduction": {"type": "seq_mean_token_sum_norm"},
        "shaping": {"dynamic_sampling": "replace"},
        "kl": {"coef": 0.01, "estimator": "k2"},
    }
    run_rl(_config(tmp_path, stopping_model_dir, letter_env, algorithm))
    for m in _metrics(tmp_path):
        assert m["batch/rollout_rounds"] == 1
        assert m["batch/groups_kept"] in (0.0, 2.0)  # replace fills to prompts_per_step (or none had signal)
        assert m["policy/kl"] >= 0
