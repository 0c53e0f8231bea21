"""Calculator: multi-turn tool use through the real calculator MCP server.

The model calls `calculate` with a Hermes `<tool_call>` block and ends with `<answer>N</answer>`.
Reward 1.0 when N equals reward_spec["ground_truth"] numerically, else 0.0. A turn with neither
an answer nor a tool call ends the episode with reward 0. Bad tool calls become error
observations the model can read, never exceptions. max_turns is enforced by the agent loop.
"""

from __future__ import annotations

import math
import re
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, StepOutput
from thermik.envs.tool_use import ServerTools
from thermik.tasks.calculator.server import TOOL_NAME, server_spec
from thermik.tools.mcp_pool import MCPPool

CALCULATE_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Evaluate arithmetic.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_number(text: str) -> float | None:
    """A finite number from text like ' 338 ' or '-3.5'; None otherwise."""
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answer_reward(answer_text: str, ground_truth: float) -> float:
    value = parse_number(answer_text)
    if value is None:
        return 0.0
    return 1.0 if math.isclose(value, ground_truth, rel_tol=1e-9, abs_tol=1e-9) else 0.0


class CalculatorEnv(Env):
    """reward_spec["ground_truth"]: the numeric answer (int, float or numeric string)."""

    uses_mcp_pool = True

    def __init__(
        self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig, pool: MCPPool
    ) -> None:
        truth = reward_spec.get("ground_truth")
        value = (
            parse_number(str(truth)) if isinstance(truth, int | float | str) and not isinstance(truth, bool) else None
        )
        if value is None:
            raise ValueError(f"calculator: reward_spec['ground_truth'] must be a number, got {truth!r}")
        self.ground_truth = value
        self.tools = [CALCULATE_SCHEMA]
        self.extra_info = extra_info
        self.options = options
        self.tool_server = ServerTools(server_spec(options.tool_latency_s), [CALCULATE_SCHEMA], options, pool)
        self.num_tool_calls = 0
        self.num_tool_failures = 0

    def step(self, action: str) -> StepOutput:
        raise TypeError("CalculatorEnv calls an MCP server asynchronously: use `await env.astep(action)`")

    async def astep(self, action: str) -> StepOutput:
        answer = _ANSWER.search(action)
        if answer is not None:
            reward = answer_reward(answer.group(1), self.ground_truth)
            return StepOutput(observations=[], reward=reward, done=True, metadata=self._metrics(0, 0))
        turn = await self.tool_server.run_turn(action)
        metadata = self._metrics(turn.calls, turn.failures)
        return StepOutput(observations=turn.observations, reward=0.0, done=not turn.found, metadata=metadata)

    def _metrics(self, calls: int, failures: int) -> dict[str, int]:
        """Per-step counts (the agent loop sums them); running totals stay on the env."""
        self.num_tool_calls += calls
        self.num_tool_failures += failures
        return {"tool_calls": calls, "tool_failures": failures}
