"""Toolbox: one name table across local Python tools and MCP servers' tools, for one rollout.

`add_local` takes a LocalTool, a ToolGroup or a plain function; `add_server` opens a per-rollout
ToolSession on an MCP server and registers every tool `list_tools` reports. A name already
taken is a ToolNameCollision, never a silent overwrite. `call` validates the tool name and the
arguments against the tool's JSON schema on the client side (servers disagree on how they
report either; FIELD-NOTES) and never raises for a bad call or a server fault.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from thermik.tools.local import LocalTool, ToolGroup, make_tool
from thermik.tools.mcp_pool import AnyServerSpec, MCPPool, ToolResult, ToolSession, truncate
from thermik.tools.parsers import ToolCall


class ToolNameCollision(ValueError):
    """Two tools (local or from servers) share one name."""


class ToolLimitError(ValueError):
    """A row or config asks for more servers or tools than its `limits` allow."""


@dataclass(frozen=True)
class _Route:
    spec: dict[str, Any]
    local: LocalTool | None = None
    session: ToolSession | None = None
    source: str = ""


class Toolbox:
    """Routes a ToolCall by name to a local tool or an MCP server's tool; close with `aclose`."""

    def __init__(self, pool: MCPPool, timeout_s: float = 10.0, max_output_chars: int = 10_000) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self._routes: dict[str, _Route] = {}
        self._sessions: list[ToolSession] = []

    @property
    def names(self) -> list[str]:
        return list(self._routes)

    @property
    def specs(self) -> list[dict[str, Any]]:
        """OpenAI function specs of every tool, in registration order (what the chat template renders)."""
        return [route.spec for route in self._routes.values()]

    def add_local(self, item: LocalTool | ToolGroup | Callable[..., Any]) -> list[str]:
        tools = list(item.tools.values()) if isinstance(item, ToolGroup) else [item]
        added = []
        for entry in tools:
            local = entry if isinstance(entry, LocalTool) else make_tool(entry)
            self._register(local.name, _Route(spec=local.spec(), local=local, source="local"))
            added.append(local.name)
        return added

    async def add_server(self, spec: AnyServerSpec, only: Sequence[str] | None = None) -> list[str]:
        """Open this rollout's session on `spec` and register its tools (or just those named in `only`).
        Raises when the server cannot start: an environment without its tools cannot run."""
        session = self.pool.open_session(spec)
        self._sessions.append(session)
        specs = await self.pool.list_tools(spec)
        available = {s["function"]["name"]: s for s in specs}
        missing = [name for name in only or () if name not in available]
        if missing:
            raise ValueError(f"MCP server {spec.label} has no tool(s) {missing}; it offers {sorted(available)}")
        names = list(only) if only else list(available)
        for name in names:
            self._register(name, _Route(spec=available[name], session=session, source=spec.label))
        return names

    async def call(self, call: ToolCall, timeout_s: float | None = None) -> ToolResult:
        """Run one call. Unknown tool, bad arguments, timeout and server faults come back as error results."""
        route = self._routes.get(call.name)
        if route is None:
            available = ", ".join(self._routes) or "none"
            return ToolResult(text=f"unknown tool '{call.name}'; available tools: {available}", is_error=True)
        problem = _schema_problem(route.spec["function"].get("parameters"), call.arguments)
        if problem is not None:
            return ToolResult(text=f"bad arguments for '{call.name}': {problem}", is_error=True)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if route.session is not None:
            return await route.session.call_tool(call.name, call.arguments, timeout, self.max_output_chars)
        assert route.local is not None
        try:
            result = await asyncio.wait_for(route.local.call(call.arguments), timeout)
        except TimeoutError:
            return ToolResult(text=f"tool '{call.name}' timed out after {timeout:g}s", is_error=True)
        return ToolResult(text=truncate(result.text, self.max_output_chars), is_error=result.is_error)

    async def aclose(self) -> None:
        """Close this rollout's server sessions (private processes stop, their data copies go)."""
        sessions, self._sessions = self._sessions, []
        await asyncio.gather(*(s.aclose() for s in sessions), return_exceptions=True)

    def _register(self, name: str, route: _Route) -> None:
        if name in self._routes:
            raise ToolNameCollision(
                f"tool name {name!r} is offered by both {self._routes[name].source!r} and {route.source!r}; "
                "rename the local tool or pick the server's tools with `only`"
            )
        self._routes[name] = route


def _schema_problem(schema: Any, arguments: dict[str, Any]) -> str | None:
    """The first way `arguments` break the tool's JSON schema, or None. A broken schema is not our call to judge."""
    if not isinstance(schema, dict):
        return None
    try:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    except Exception:  # a server's broken or exotic schema: leave the judgement to the server
        return None
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return truncate(f"{where}: {error.message}" if where else error.message, 300)
