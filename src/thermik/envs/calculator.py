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
from thermik.envs.base import Env, Message, StepOutput
from thermik.tools.mcp_pool import ToolResult, default_pool
from thermik.tools.parsers import parse_hermes_tool_calls
from thermik.tools.servers.calculator import TOOL_NAME, server_spec

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
_SDK_ERROR_PREFIX = f"Error executing tool {TOOL_NAME}: "


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

    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
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
        self.server = server_spec(options.tool_latency_s)
        self.num_tool_calls = 0
        self.num_tool_failures = 0

    def step(self, action: str) -> StepOutput:
        raise TypeError("CalculatorEnv calls an MCP server asynchronously: use `await env.astep(action)`")

    async def astep(self, action: str) -> StepOutput:
        answer = _ANSWER.search(action)
        if answer is not None:
            reward = answer_reward(answer.group(1), self.ground_truth)
            return StepOutput(observations=[], reward=reward, done=True, metadata=self._metrics(0, 0))
        parsed = parse_hermes_tool_calls(action)
        if not parsed.found:
            return StepOutput(observations=[], reward=0.0, done=True, metadata=self._metrics(0, 0))
        observations: list[Message] = [{"role": "tool", "content": f"error: {e.message}"} for e in parsed.errors]
        failures = len(parsed.errors)
        for call in parsed.calls:
            result = await self._call(call.name, call.arguments)
            failures += result.is_error
            observations.append(_observation(call.name, result))
        calls = len(parsed.calls) + len(parsed.errors)
        return StepOutput(observations=observations, reward=0.0, done=False, metadata=self._metrics(calls, failures))

    async def _call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        # Validated here: servers disagree on how they report an unknown tool.
        if name != TOOL_NAME:
            return ToolResult(text=f"unknown tool '{name}'; available: {TOOL_NAME}", is_error=True)
        return await default_pool().call_tool(self.server, name, arguments, self.options.tool_timeout_s)

    def _metrics(self, calls: int, failures: int) -> dict[str, int]:
        """Per-step counts (the agent loop sums them); running totals stay on the env."""
        self.num_tool_calls += calls
        self.num_tool_failures += failures
        return {"tool_calls": calls, "tool_failures": failures}


def _observation(name: str, result: ToolResult) -> Message:
    if result.is_error:
        return {"role": "tool", "name": name, "content": "error: " + result.text.removeprefix(_SDK_ERROR_PREFIX)}
    return {"role": "tool", "name": name, "content": result.text}
