"""Tool calls of one assistant turn -> observations, through an MCP server of the run's pool.

Shared by the environments whose model talks to one thermik MCP server (calculator, text2sql, search, code):
parse Hermes `<tool_call>` blocks, refuse unknown tool names client-side (servers disagree on how
they report them), call the rest, and turn every result or failure into a `tool` observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Message
from thermik.tools.mcp_pool import MCPPool, ServerSpec, ToolResult
from thermik.tools.parsers import parse_hermes_tool_calls


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
        observations: list[Message] = [{"role": "tool", "content": f"error: {e.message}"} for e in parsed.errors]
        failures = len(parsed.errors)
        for call in parsed.calls:
            result = await self.call(call.name, call.arguments)
            failures += result.is_error
            observations.append(tool_observation(call.name, result))
        return ToolTurn(True, observations, calls=len(parsed.calls) + len(parsed.errors), failures=failures)

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name not in self.names:
            return ToolResult(text=f"unknown tool '{name}'; available: {', '.join(self.names)}", is_error=True)
        return await self.pool.call_tool(self.spec, name, arguments, self.options.tool_timeout_s)


def tool_observation(name: str, result: ToolResult) -> Message:
    """A `tool` message; errors lose the SDK's 'Error executing tool NAME: ' prefix and start with 'error: '."""
    if result.is_error:
        text = result.text.removeprefix(f"Error executing tool {name}: ")
        return {"role": "tool", "name": name, "content": "error: " + text}
    return {"role": "tool", "name": name, "content": result.text}
