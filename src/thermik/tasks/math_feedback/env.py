"""Multi-turn math with feedback: a wrong answer gets "Incorrect, try again." and another attempt.

Same rows and extraction as gsm8k (reward_spec["ground_truth"], optional "extraction"), plus optional
reward_spec["decay"] (default 0.5). A correct answer at attempt t (1-based) earns decay ** (t - 1): 1.0 on
the first attempt, 0.5 on the second, ... The episode ends at the first correct answer, or with reward 0
after options.max_turns attempts.
"""

from __future__ import annotations

from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, StepOutput
from thermik.tasks.gsm8k.env import read_math_spec, verdicts

FEEDBACK = "Incorrect, try again."


class MathFeedbackEnv(Env):
    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        self.ground_truth, self.extraction = read_math_spec("math_feedback", reward_spec)
        decay = reward_spec.get("decay", 0.5)
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0 <= decay <= 1:
            raise ValueError(f"math_feedback: reward_spec['decay'] must be a number in [0, 1], got {decay!r}")
        self.decay = float(decay)
        self.max_attempts = options.max_turns
        self.attempts = 0
        self.extra_info = extra_info

    def step(self, action: str) -> StepOutput:
        self.attempts += 1
        found = verdicts(action, self.ground_truth)
        metadata: dict[str, Any] = {**found, "attempts": self.attempts}
        if found[f"correct_{self.extraction}"]:
            return StepOutput([], self.decay ** (self.attempts - 1), True, metadata)
        if self.attempts >= self.max_attempts:
            return StepOutput([], 0.0, True, metadata)
        return StepOutput([{"role": "user", "content": FEEDBACK}], 0.0, False, metadata)
