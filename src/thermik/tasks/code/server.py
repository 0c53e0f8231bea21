"""Python sandbox MCP server (stdio): run_python(code, timeout_s) in a limited child process.

Run: `python -m thermik.tasks.code.server [--cpu S] [--memory-mb M] [--max-wall S]`.
Each call gets a fresh temp directory; what the limits enforce is listed in sandbox_runner.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from thermik.tasks.code.sandbox_runner import SandboxLimits, run_python
from thermik.tools.mcp_launch import module_server_spec
from thermik.tools.mcp_pool import ServerSpec

TOOL_NAME = "run_python"
MAX_CONCURRENT_RUNS = 4


def server_spec(limits: SandboxLimits | None = None) -> ServerSpec:
    limits = limits or SandboxLimits()
    args = ("--cpu", str(limits.cpu_s), "--memory-mb", str(limits.memory_mb), "--max-wall", repr(limits.wall_s))
    return module_server_spec("thermik.tasks.code.server", *args)


def build_server(limits: SandboxLimits) -> MCPServer:
    app: MCPServer = MCPServer(name="thermik-python-sandbox")
    slots = asyncio.Semaphore(MAX_CONCURRENT_RUNS)

    @app.tool(
        name=TOOL_NAME,
        description="Run Python code in a sandbox (no network, no subprocesses, writes only in its temp dir); "
        "returns the exit code, stdout and stderr.",
    )
    async def run(code: str, timeout_s: float = limits.wall_s) -> str:
        if not 0 < timeout_s <= limits.wall_s:
            raise ToolError(f"timeout_s must be in (0, {limits.wall_s:g}], got {timeout_s}")
        call_limits = dataclasses.replace(limits, wall_s=timeout_s)
        async with slots:
            try:
                result = await asyncio.to_thread(run_python, code, call_limits)
            except (TypeError, ValueError) as exc:
                raise ToolError(str(exc)) from None
        return result.format()

    return app


def main(argv: list[str] | None = None) -> None:
    defaults = SandboxLimits()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, default=defaults.cpu_s, help="CPU seconds per run (RLIMIT_CPU).")
    parser.add_argument("--memory-mb", type=int, default=defaults.memory_mb, help="Address space per run (MiB).")
    parser.add_argument("--max-wall", type=float, default=defaults.wall_s, help="Largest allowed timeout_s.")
    args = parser.parse_args(argv)
    if args.cpu < 1 or args.memory_mb < 32 or args.max_wall <= 0:
        parser.error("need --cpu >= 1, --memory-mb >= 32 and --max-wall > 0")
    build_server(SandboxLimits(wall_s=args.max_wall, cpu_s=args.cpu, memory_mb=args.memory_mb)).run()


if __name__ == "__main__":
    main()
