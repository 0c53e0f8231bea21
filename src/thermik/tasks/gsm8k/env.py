"""GSM8K-style math, single turn.

reward_spec: {"ground_truth": "42", "extraction": "strict" | "lenient"} (extraction defaults to strict).
Strict reads only `#### N` or `<answer>N</answer>` (the last one); lenient takes the last number in the
text. Reward 1.0 when the extracted number equals the ground truth, else 0.0. Metadata reports both
extractions' verdicts, so a run can see how much formatting costs.
"""

from __future__ import annotations

from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.answers import EXTRACTORS, numbers_match, to_number
from thermik.envs.base import Env, StepOutput


def read_math_spec(env: str, reward_spec: dict[str, Any]) -> tuple[str, str]:
    """(ground truth as text, extraction name), validated."""
    truth = reward_spec.get("ground_truth")
    if isinstance(truth, bool) or not isinstance(truth, int | float | str) or to_number(str(truth)) is None:
        raise ValueError(f"{env}: reward_spec['ground_truth'] must be a number or numeric string, got {truth!r}")
    extraction = reward_spec.get("extraction", "strict")
    if extraction not in EXTRACTORS:
        raise ValueError(f"{env}: reward_spec['extraction'] must be one of {sorted(EXTRACTORS)}, got {extraction!r}")
    return str(truth), extraction


def verdicts(action: str, truth: str) -> dict[str, bool]:
    """Whether each extraction finds the right number."""
    return {f"correct_{name}": numbers_match(extract(action), truth) for name, extract in EXTRACTORS.items()}


class GSM8KEnv(Env):
    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        self.ground_truth, self.extraction = read_math_spec("gsm8k", reward_spec)
        self.extra_info = extra_info
        self.options = options

    def step(self, action: str) -> StepOutput:
        found = verdicts(action, self.ground_truth)
        reward = float(found[f"correct_{self.extraction}"])
        return StepOutput(observations=[], reward=reward, done=True, metadata=found)
