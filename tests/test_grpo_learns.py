"""GRPO end to end through the real loop, engine and trainer: a reward the untrained model
almost never earns is learned within a few dozen steps (checks the sign and plumbing of the update)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import short_rl_config
from thermik.config.schema import RunConfig
from thermik.envs.base import Env, StepOutput
from thermik.envs.registry import register, unregister
from thermik.runs.local import run_rl


class CountLetterEnv(Env):
    """Single turn; reward = fraction of characters that are lowercase ASCII letters (~0.1 for random bytes)."""

    def __init__(self, reward_spec: dict, extra_info: dict, options: object) -> None:
        pass

    def step(self, action: str) -> StepOutput:
        return StepOutput([], sum("a" <= c <= "z" for c in action) / max(len(action), 1), True)


def lowercase_run_config(tmp_path: Path, model_dir: Path, name: str, **trainer: object) -> RunConfig:
    """A short GRPO run of the registered `lowercase` env on reverse_text prompts (their ground truth unused)."""
    return short_rl_config(tmp_path, model_dir, name, "lowercase", trainer={"optimizer": {"lr": 1e-3}, **trainer})


@pytest.mark.slow
def test_grpo_raises_reward(tmp_path, tiny_model_dir) -> None:
    cfg = lowercase_run_config(tmp_path, tiny_model_dir, "count-a", optimizer={"lr": 3e-3})  # > 0.95 on seeds 0-2
    register("lowercase", f"{__name__}:CountLetterEnv")
    try:
        result = run_rl(cfg)
    finally:
        unregister("lowercase")
    assert result["before"]["reward"] < 0.25
    assert result["after"]["reward"] > 0.6
    lines = [json.loads(x) for x in (tmp_path / "count-a" / "metrics.jsonl").read_text().splitlines()]
    mismatch = [x["mismatch/logprob_abs_diff"] for x in lines if "mismatch/logprob_abs_diff" in x]
    assert max(mismatch) < 1e-3  # rollout and trainer logprobs agree (same weights, same temperature)
    steps = [x for x in lines if "time/step" in x]
    # the halves run alone in a synchronous step: each reports this process's CPU seconds (async_vs_sync's bound)
    assert all(x["time/generate_cpu"] > 0 and x["time/train_cpu"] > 0 for x in steps)
