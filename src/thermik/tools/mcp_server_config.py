"""MCP server definitions as users write them -> ServerSpec / HttpServerSpec.

Two forms: a config string `name=command arg ...` (stdio, split like a shell line) or
`name=http://host:port/mcp` (streamable HTTP); and a dict, as a dataset row carries it in
`extra_info["mcp_servers"]`, with every option (see MCPServerEntry).
"""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from thermik.tools.mcp_pool import AnyServerSpec, HttpServerSpec, ServerSpec


class MCPServerEntry(BaseModel):
    """One MCP server as a row (or a JSON file) names it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="Name used in logs and by rows that refer to it.")
    command: str = Field("", description="Executable of a stdio server.")
    args: list[str] = Field(default_factory=list, description="Its arguments; may use {data_path} / {data_dir}.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    cwd: str = Field("", description="Working directory; may use {data_dir}.")
    url: str = Field("", description="Streamable-HTTP endpoint instead of a command.")
    data_path: str = Field("", description="File or directory copied per rollout (makes the server stateful).")
    stateful: bool = Field(False, description="One process per rollout even without data.")
    tools: list[str] = Field(default_factory=list, description="Expose only these tools (empty: all).")

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerEntry:
        if bool(self.command) == bool(self.url):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of 'command' (stdio) or 'url' (HTTP)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must start with http:// or https://, got {self.url!r}")
        if self.url and (self.data_path or self.stateful):
            raise ValueError(f"MCP server {self.name!r}: data_path/stateful need a stdio server (a 'command')")
        return self

    def spec(self) -> AnyServerSpec:
        if self.url:
            return HttpServerSpec(url=self.url, name=self.name)
        return ServerSpec(
            command=self.command,
            args=tuple(self.args),
            env=tuple(sorted(self.env.items())),
            name=self.name,
            cwd=self.cwd or None,
            data_path=self.data_path or None,
            stateful=self.stateful,
        )


def parse_server_string(text: str) -> MCPServerEntry:
    """'name=command args...' or 'name=http://...' -> MCPServerEntry; a clear ValueError otherwise."""
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"MCP server must look like 'name=command args...' or 'name=http://host/mcp', got {text!r}")
    rest = rest.strip()
    if rest.startswith(("http://", "https://")):
        return MCPServerEntry(name=name.strip(), url=rest)
    try:
        parts = shlex.split(rest)
    except ValueError as exc:
        raise ValueError(f"MCP server {name.strip()!r}: cannot split {rest!r}: {exc}") from None
    return MCPServerEntry(name=name.strip(), command=parts[0], args=parts[1:])


def parse_server_entry(item: str | dict[str, Any]) -> MCPServerEntry:
    """A config string or a row's dict -> MCPServerEntry, with the offending entry named on error."""
    if isinstance(item, str):
        return parse_server_string(item)
    if isinstance(item, dict):
        try:
            return MCPServerEntry.model_validate(item)
        except ValidationError as exc:
            raise ValueError(f"bad MCP server entry {item!r}: {exc.errors()[0]['msg']}") from None
    raise ValueError(f"an MCP server entry must be a string or a dict, got {type(item).__name__}")
