"""Tool calls of one assistant turn -> observations, through an MCP server of the run's pool.

Shared by the environments whose model talks to one thermik MCP server (calculator, text2sql, search, code):
parse Hermes `<tool_call>` blocks, refuse unknown tool names client-side (servers disagree on how
they report them), call the rest, and turn every result or failure into a `tool` observation.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Message
from thermik.tools.mcp_pool import MCPPool, ServerSpec, ToolResult
from thermik.tools.parsers import ParsedToolCalls, ToolCall, ToolParseError, parse_hermes_tool_calls


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI-style function schema, the shape chat templates render."""
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


@dataclass
class ToolTurn:
    """What the tool calls of one turn produced; `found` is False when the turn had no `<tool_call>` block."""

    found: bool
    observations: list[Message]
    calls: int = 0
    failures: int = 0

    def metrics(self) -> dict[str, int]:
        """The per-step counts the agent loop sums."""
        return {"tool_calls": self.calls, "tool_failures": self.failures}


class ServerTools:
    """The tools of one MCP server, as an environment uses them; calls go through `pool` (owned by the run)."""

    def __init__(self, spec: ServerSpec, schemas: list[dict[str, Any]], options: EnvConfig, pool: MCPPool) -> None:
        self.spec = spec
        self.pool = pool
        self.schemas = schemas
        self.names = tuple(s["function"]["name"] for s in schemas)
        self.options = options

    async def run_turn(self, action: str) -> ToolTurn:
        parsed = parse_hermes_tool_calls(action)
        if not parsed.found:
            return ToolTurn(found=False, observations=[])
        answered = await answer_calls(parsed, lambda c: self.call(c.name, c.arguments), self.options)
        return ToolTurn(True, answered.observations, calls=len(parsed.items), failures=answered.failures)

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name not in self.names:
            return ToolResult(text=f"unknown tool '{name}'; available: {', '.join(self.names)}", is_error=True)
        return await self.pool.call_tool(self.spec, name, arguments, self.options.tool_timeout_s)


@dataclass
class AnsweredCalls:
    """The observations of one turn's tool-call blocks, in block order, and what they did."""

    observations: list[Message]
    failures: int
    succeeded: list[ToolCall]


async def answer_calls(
    parsed: ParsedToolCalls, call: Callable[[ToolCall], Awaitable[ToolResult]], options: EnvConfig
) -> AnsweredCalls:
    """Run the calls in block order; an unreadable block answers with its parse error in its place, so a template
    that pairs results with calls by position pairs them right. A result matching `options.tool_error_pattern`
    counts as a failure (servers that report errors as text)."""
    pattern = re.compile(options.tool_error_pattern) if options.tool_error_pattern else None
    out = AnsweredCalls([], 0, [])
    for item in parsed.items:
        if isinstance(item, ToolParseError):
            out.observations.append({"role": "tool", "content": f"error: {item.message}"})
            out.failures += 1
            continue
        result = await call(item)
        if not result.is_error and pattern is not None and pattern.search(result.text):
            result = ToolResult(text=result.text, is_error=True)
        out.failures += result.is_error
        if not result.is_error:
            out.succeeded.append(item)
        out.observations.append(tool_observation(item.name, result))
    return out


_SDK_ERROR_PREFIX = re.compile(r"^Error executing tool [^:]*: ")


def tool_observation(name: str, result: ToolResult) -> Message:
    """A `tool` message; errors lose the SDK's 'Error executing tool NAME: ' prefix and start with 'error: '."""
    if result.is_error:
        return {"role": "tool", "name": name, "content": "error: " + _SDK_ERROR_PREFIX.sub("", result.text)}
    return {"role": "tool", "name": name, "content": result.text}
