"""A one-turn environment whose every episode start and step is a real MCP call (the faulty test server's `echo`),
so a kill can land in an MCP call. Reward: deterministic in the action. The server's command line carries
$RELIABILITY_MARKER, which lets the suite find a server that outlived its run."""

from __future__ import annotations

import os
from typing import Any

from fixtures.faulty_server import server_spec

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, Message, StepOutput
from thermik.tools.mcp_pool import MCPPool


class EchoEnv(Env):
    uses_mcp_pool = True

    def __init__(
        self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig, pool: MCPPool
    ) -> None:
        self.pool, self.options = pool, options
        self.spec = server_spec("--state-file", os.environ.get("RELIABILITY_MARKER", os.devnull))

    def init(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        return prompt, {}

    async def ainit(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        """Every episode calls the server once at its start (a turn cut by the length limit never reaches astep)."""
        await self.pool.call_tool(self.spec, "echo", {"text": prompt[-1]["content"][:64]}, self.options.tool_timeout_s)
        return prompt, {}

    async def astep(self, action: str) -> StepOutput:
        result = await self.pool.call_tool(self.spec, "echo", {"text": action[:64]}, self.options.tool_timeout_s)
        reward = 0.0 if result.is_error else float(sum(map(ord, result.text)) % 2)
        return StepOutput([], reward, True, {"tool_calls": 1, "tool_failures": int(result.is_error)})
