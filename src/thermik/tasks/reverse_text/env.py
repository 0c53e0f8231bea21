"""Reverse text: single turn; reward = difflib similarity of the `<reversed>` text to the reversed input."""

from __future__ import annotations

import difflib
import re
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, StepOutput

_REVERSED = re.compile(r"<reversed>(.*?)</reversed>", re.DOTALL)


def reversal_reward(action: str, ground_truth: str) -> float:
    """difflib ratio of the first `<reversed>...</reversed>` text (stripped) to the truth; 0 without tags."""
    match = _REVERSED.search(action)
    if match is None:
        return 0.0
    return difflib.SequenceMatcher(None, match.group(1).strip(), ground_truth, autojunk=False).ratio()


class ReverseTextEnv(Env):
    """reward_spec["ground_truth"] is the reversed input text."""

    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        ground_truth = reward_spec.get("ground_truth")
        if not isinstance(ground_truth, str):
            raise ValueError(f"reverse_text: reward_spec['ground_truth'] must be a string, got {ground_truth!r}")
        self.ground_truth = ground_truth
        self.extra_info = extra_info
        self.options = options

    def step(self, action: str) -> StepOutput:
        reward = reversal_reward(action, self.ground_truth)
        return StepOutput(observations=[], reward=reward, done=True, metadata={"similarity": reward})
