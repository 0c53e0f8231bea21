"""Calculator MCP server (stdio): one tool, `calculate(expression) -> str`.

Run: `python -m thermik.tasks.calculator.server [--latency SECONDS]`. The latency option
sleeps before each answer, to simulate slow tools.
"""

from __future__ import annotations

import argparse
import asyncio

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from thermik.tasks.calculator.arith import ArithError, evaluate, format_number
from thermik.tools.mcp_launch import module_server_spec
from thermik.tools.mcp_pool import ServerSpec

TOOL_NAME = "calculate"
TOOL_DESCRIPTION = "Evaluate an arithmetic expression (+ - * / // % **, parentheses)."


def server_spec(latency_s: float = 0.0) -> ServerSpec:
    """How MCPPool launches this server with the current interpreter."""
    args = ("--latency", repr(float(latency_s))) if latency_s > 0 else ()
    return module_server_spec("thermik.tasks.calculator.server", *args)


def build_server(latency_s: float = 0.0) -> MCPServer:
    """An MCPServer exposing `calculate`; `latency_s` is slept before each answer."""
    if latency_s < 0:
        raise ValueError(f"latency_s must be >= 0, got {latency_s}")
    app: MCPServer = MCPServer(name="thermik-calculator")

    @app.tool(name=TOOL_NAME, description=TOOL_DESCRIPTION)
    async def calculate(expression: str) -> str:
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        try:
            return format_number(evaluate(expression))
        except ArithError as exc:
            raise ToolError(str(exc)) from None

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.0, help="Seconds slept before each answer.")
    args = parser.parse_args(argv)
    if args.latency < 0:
        parser.error(f"--latency must be >= 0, got {args.latency}")
    build_server(args.latency).run()


if __name__ == "__main__":
    main()
