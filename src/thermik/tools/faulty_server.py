"""A misbehaving MCP server for fault tests: crashes, hangs, floods, emits bad bytes, keeps file state.

Run: `python -m thermik.tools.faulty_server [--crash-after N] [--state-file PATH] [--start-delay S]
[--transport stdio|streamable-http --port P]`.

Tools: `echo(text)`, `add(a, b)`, `sleep(seconds)` (async: the server stays responsive),
`block(seconds)` (blocks the whole process: a hung server), `crash()` (exits at once),
`big_output(chars)`, `pid()`, `non_utf8()` (writes invalid UTF-8 bytes onto the protocol stream, then
answers), `increment()` (adds 1 to the integer in `--state-file` and returns it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from thermik.tools.launch import module_server_spec
from thermik.tools.mcp_pool import ServerSpec

MODULE = "thermik.tools.faulty_server"


def server_spec(*extra_args: str, data_path: str | None = None, name: str = "faulty") -> ServerSpec:
    """How MCPPool launches this server with the current interpreter (PYTHONPATH kept for a source checkout)."""
    return module_server_spec(MODULE, *extra_args, name=name, data_path=data_path)


_WIRE_INODE: list[int] = []


def _wire_fd() -> int:
    """The descriptor carrying the protocol: the SDK moves it off fd 1 (diverted to stderr) at start-up."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):
            if fd > 2 and _WIRE_INODE and os.fstat(fd).st_ino == _WIRE_INODE[0]:
                return fd
    return 1


def build_server(crash_after: int = 0, state_file: Path | None = None) -> MCPServer:
    app: MCPServer = MCPServer(name="thermik-faulty")
    calls = 0

    def count() -> None:
        nonlocal calls
        calls += 1
        if crash_after and calls >= crash_after:
            os._exit(3)

    _add_first_tools(app, count)
    _add_last_tools(app, count, state_file)
    return app


def _add_first_tools(app: MCPServer, count: Callable[[], None]) -> None:
    """echo, add, sleep (async), block (a hung server), pid; in the order list_tools reports them."""

    @app.tool()
    async def echo(text: str) -> str:
        """Return the text unchanged."""
        count()
        return text

    @app.tool()
    async def add(a: int, b: int) -> str:
        """Add two integers."""
        count()
        return str(a + b)

    @app.tool()
    async def sleep(seconds: float) -> str:
        """Sleep without blocking the server, then answer."""
        count()
        await asyncio.sleep(seconds)
        return f"slept {seconds:g}s"

    @app.tool()
    async def block(seconds: float) -> str:
        """Block the whole server process (it answers nothing meanwhile)."""
        count()
        time.sleep(seconds)  # on the event loop on purpose: a hung server
        return "unblocked"

    @app.tool()
    async def pid() -> str:
        """The server's process id."""
        return str(os.getpid())


def _add_last_tools(app: MCPServer, count: Callable[[], None], state_file: Path | None) -> None:
    """crash, big_output, non_utf8 (garbage on the wire), increment (file state); after the first ones."""

    @app.tool()
    async def crash() -> str:
        """Exit the server process immediately."""
        os._exit(3)

    @app.tool()
    async def big_output(chars: int) -> str:
        """Return `chars` characters."""
        count()
        return "x" * chars

    @app.tool()
    async def non_utf8() -> str:
        """Write invalid UTF-8 bytes to stdout (the protocol stream), then answer."""
        count()
        os.write(_wire_fd(), b"\xff\xfe\xfa not utf-8 \xc3\x28\n")
        return "after garbage"

    @app.tool()
    async def increment() -> str:
        """Add 1 to the integer kept in the state file and return it."""
        count()
        if state_file is None:
            raise ToolError("server started without --state-file")
        value = int(state_file.read_text() or "0") + 1
        state_file.write_text(str(value))
        return str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crash-after", type=int, default=0, help="Exit on the N-th tool call (0: never).")
    parser.add_argument("--state-file", type=Path, default=None, help="File holding the `increment` counter.")
    parser.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    parser.add_argument("--port", type=int, default=8000, help="Port for --transport streamable-http.")
    parser.add_argument("--start-delay", type=float, default=0.0, help="Seconds to wait before serving (slow start).")
    args = parser.parse_args(argv)
    time.sleep(args.start_delay)
    _WIRE_INODE.append(os.fstat(1).st_ino)
    app = build_server(args.crash_after, args.state_file)
    if args.transport == "stdio":
        app.run()
    else:
        app.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
