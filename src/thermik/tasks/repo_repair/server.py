"""Repo-repair MCP server (stdio), one per episode: bash, read_file, edit_file, search, run_tests, finish.

Run: `python -m thermik.tasks.repo_repair.server --workspace DIR [--timeout 30] [--cpu 30] [--memory-mb 2048]
[--processes 64] [--max-output-chars 4000]`. DIR is the episode's copy of the repository (the MCP pool makes
one per episode: the server spec is stateful, with the task's repository as its data); commands run in the
sandbox of tasks/repo_repair/sandbox.py on it. An agent behind the OpenAI-compatible endpoint can use the same
server.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from thermik.config.schema import RepoRepairConfig
from thermik.tasks.repo_repair.sandbox import Sandbox, SandboxLimits
from thermik.tasks.repo_repair.tools import SCHEMAS, RepoTools, ToolFailure
from thermik.tools.mcp_launch import module_server_spec
from thermik.tools.mcp_pool import ServerSpec


def limits_of(cfg: RepoRepairConfig) -> SandboxLimits:
    return SandboxLimits(
        wall_s=cfg.command_timeout_s, cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb, processes=cfg.processes,
        max_output_chars=cfg.max_output_chars,
    )  # fmt: skip


def server_spec(repo: str, cfg: RepoRepairConfig) -> ServerSpec:
    """A per-episode server on a private copy of `repo` (stateful: the pool copies the repo for each episode)."""
    args = ("--workspace", "{data_path}", "--timeout", repr(cfg.command_timeout_s), "--cpu", str(cfg.cpu_s))
    args += ("--memory-mb", str(cfg.memory_mb), "--processes", str(cfg.processes))
    args += ("--max-output-chars", str(cfg.max_output_chars))
    return module_server_spec("thermik.tasks.repo_repair.server", *args, name="repo_repair", data_path=repo)


def build_server(tools: RepoTools) -> MCPServer:
    app: MCPServer = MCPServer(name="thermik-repo-repair")
    lock = asyncio.Lock()  # one command at a time on the workspace

    async def run(name: str, arguments: dict[str, Any]) -> str:
        async with lock:
            try:
                return await asyncio.to_thread(tools.call, name, arguments)
            except ToolFailure as exc:
                raise ToolError(str(exc)) from None

    @app.tool(name="bash", description=_description("bash"))
    async def bash(command: str, timeout_s: float | None = None) -> str:
        return await run("bash", {"command": command, "timeout_s": timeout_s})

    @app.tool(name="read_file", description=_description("read_file"))
    async def read_file(path: str, start_line: int = 1, end_line: int | None = None) -> str:
        return await run("read_file", {"path": path, "start_line": start_line, "end_line": end_line})

    @app.tool(name="edit_file", description=_description("edit_file"))
    async def edit_file(path: str, old_str: str, new_str: str) -> str:
        return await run("edit_file", {"path": path, "old_str": old_str, "new_str": new_str})

    @app.tool(name="search", description=_description("search"))
    async def search(pattern: str, path: str = ".") -> str:
        return await run("search", {"pattern": pattern, "path": path})

    @app.tool(name="run_tests", description=_description("run_tests"))
    async def run_tests(tests: str = "") -> str:
        return await run("run_tests", {"tests": tests})

    @app.tool(name="finish", description=_description("finish"))
    async def finish() -> str:
        return await run("finish", {})

    return app


def _description(name: str) -> str:
    return next(s["function"]["description"] for s in SCHEMAS if s["function"]["name"] == name)


def main(argv: list[str] | None = None) -> None:
    defaults = RepoRepairConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", required=True, help="The episode's copy of the repository.")
    parser.add_argument("--timeout", type=float, default=defaults.command_timeout_s, help="Wall seconds per command.")
    parser.add_argument("--cpu", type=int, default=defaults.cpu_s, help="CPU seconds per command.")
    parser.add_argument("--memory-mb", type=int, default=defaults.memory_mb, help="Address space per process (MiB).")
    parser.add_argument("--processes", type=int, default=defaults.processes, help="Processes per command.")
    parser.add_argument("--max-output-chars", type=int, default=defaults.max_output_chars, help="Output kept.")
    args = parser.parse_args(argv)
    cfg = RepoRepairConfig(
        command_timeout_s=args.timeout, cpu_s=args.cpu, memory_mb=args.memory_mb, processes=args.processes,
        max_output_chars=args.max_output_chars,
    )  # fmt: skip
    with Sandbox(None, limits_of(cfg), adopt=Path(args.workspace)) as sandbox:
        build_server(RepoTools(sandbox, cfg.max_output_chars)).run()


if __name__ == "__main__":
    main()
