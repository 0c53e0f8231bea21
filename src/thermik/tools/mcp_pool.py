"""MCPPool: one shared stdio ClientSession per MCP server spec, reused by every episode.

Spawning and initializing a Python MCP server costs ~1 s, a call ~2-3 ms, and one stdio
session multiplexes concurrent calls, so a stateless server is started once per pool
(lazily, inside the running event loop) and shared.

anyio context managers (stdio_client, ClientSession) must be exited by the task that
entered them. Each connection therefore lives in its own owner task that enters both,
signals ready, waits for a stop event and exits them; callers in any task only send
requests on the session.

A timeout or a dead server never raises out of `call_tool`: it returns
ToolResult(is_error=True). A connection that died (or stopped answering pings after a
timeout) is dropped and a fresh one is started on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import REQUEST_TIMEOUT

logger = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 10_000
"""Tool outputs are cut to this many characters before they reach a prompt."""
_PING_TIMEOUT_S = 2.0
_CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerSpec:
    """How to launch one stdio MCP server. Equal specs share one session."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables (the SDK passes only a safe subset of ours)."""

    def params(self) -> StdioServerParameters:
        return StdioServerParameters(command=self.command, args=list(self.args), env=dict(self.env) or None)

    def __str__(self) -> str:
        return " ".join((self.command, *self.args))


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool


class _Connection:
    """One server process + initialized ClientSession, owned by a dedicated task."""

    def __init__(self, spec: ServerSpec, errlog: TextIO) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self.broken = False
        self._errlog = errlog
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float) -> None:
        self._task = asyncio.create_task(self._own(), name=f"mcp-server:{self.spec}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            await self.close()
            raise TimeoutError(f"MCP server did not initialize within {timeout_s:g}s: {self.spec}") from None
        if self.session is None:
            await self.close()
            raise RuntimeError(f"MCP server failed to start: {self.spec}: {self._error!r}")

    async def _own(self) -> None:
        try:
            async with (
                stdio_client(self.spec.params(), errlog=self._errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                self.session = session
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # reported by start(); a later death is seen by call_tool
            self._error = exc
            logger.debug("MCP server %s ended with %r", self.spec, exc)
        finally:
            self.session = None
            self.broken = True
            self._ready.set()

    async def close(self) -> None:
        """Stop the owner task; its context managers close the session and reap the process."""
        self.broken = True
        self._stop.set()
        if self._task is None or self._task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), _CLOSE_TIMEOUT_S)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class MCPPool:
    """Shared stdio MCP sessions keyed by ServerSpec. Use inside one event loop; close with `aclose`."""

    def __init__(
        self,
        log_dir: str | Path | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._startup_timeout_s = startup_timeout_s
        self._max_output_chars = max_output_chars
        self._connections: dict[ServerSpec, _Connection] = {}
        self._locks: dict[ServerSpec, asyncio.Lock] = {}
        self._errlog: TextIO | None = None
        self._errlog_path: Path | None = None
        self._closed = False

    @property
    def errlog_path(self) -> Path | None:
        """File receiving the servers' stderr (created on the first spawn)."""
        return self._errlog_path

    async def call_tool(self, spec: ServerSpec, name: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        """Call tool `name` on the server of `spec`. Never raises for tool, timeout or server failures."""
        if self._closed:
            raise RuntimeError("MCPPool is closed")
        try:
            conn = await self._connection(spec)
        except (OSError, RuntimeError, TimeoutError) as exc:
            return ToolResult(text=f"tool server unavailable: {exc}", is_error=True)
        session = conn.session
        if session is None:
            return ToolResult(text=f"tool server unavailable: {spec}", is_error=True)
        try:
            result = await session.call_tool(name, arguments, read_timeout_seconds=timeout_s)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                await self._check_alive(conn)
                return ToolResult(text=f"tool '{name}' timed out after {timeout_s:g}s", is_error=True)
            conn.broken = True  # connection closed (-32000) or protocol error: restart next call
            return ToolResult(text=f"tool '{name}' failed: {exc.message}", is_error=True)
        except Exception as exc:  # transport torn down under us (closed/broken streams)
            conn.broken = True
            return ToolResult(text=f"tool '{name}' failed: {type(exc).__name__}: {exc}", is_error=True)
        return ToolResult(text=self._text(result.content), is_error=bool(result.is_error))

    async def aclose(self) -> None:
        """Close every session and reap every server process. Idempotent."""
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(conn.close() for conn in connections), return_exceptions=True)
        if self._errlog is not None:
            self._errlog.close()

    async def _connection(self, spec: ServerSpec) -> _Connection:
        conn = self._connections.get(spec)
        if conn is not None and not conn.broken:
            return conn
        async with self._locks.setdefault(spec, asyncio.Lock()):
            conn = self._connections.get(spec)
            if conn is not None and not conn.broken:
                return conn  # another caller restarted it while we waited
            if conn is not None:
                del self._connections[spec]
                await conn.close()
            conn = _Connection(spec, self._open_errlog(spec))
            await conn.start(self._startup_timeout_s)
            self._connections[spec] = conn
            return conn

    async def _check_alive(self, conn: _Connection) -> None:
        """After a timeout: keep a slow-but-alive server, drop a hung one."""
        session = conn.session
        if session is None:
            conn.broken = True
            return
        try:
            await asyncio.wait_for(session.send_ping(), _PING_TIMEOUT_S)
        except (MCPError, TimeoutError):
            conn.broken = True

    def _open_errlog(self, spec: ServerSpec) -> TextIO:
        if self._errlog is None:
            directory = self._log_dir if self._log_dir is not None else Path(tempfile.gettempdir())
            directory.mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=f"thermik-mcp-{os.getpid()}-", suffix=".log", dir=directory)
            self._errlog = open(fd, "a", encoding="utf-8")  # noqa: SIM115 -- lives as long as the pool
            self._errlog_path = Path(path)
            logger.info("MCP server stderr goes to %s", path)
        self._errlog.write(f"--- starting MCP server: {spec}\n")
        self._errlog.flush()
        return self._errlog

    def _text(self, content: list[Any]) -> str:
        parts = [getattr(block, "text", None) or f"[{getattr(block, 'type', 'unknown')} content]" for block in content]
        text = "\n".join(parts)
        if len(text) > self._max_output_chars:
            text = text[: self._max_output_chars] + f"... [truncated {len(text) - self._max_output_chars} chars]"
        return text


_DEFAULT_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MCPPool] = weakref.WeakKeyDictionary()


def default_pool() -> MCPPool:
    """The process-wide pool of the running event loop (one per loop). Call from inside the loop."""
    loop = asyncio.get_running_loop()
    pool = _DEFAULT_POOLS.get(loop)
    if pool is None or pool._closed:
        pool = _DEFAULT_POOLS[loop] = MCPPool()
    return pool


async def close_default_pool() -> None:
    """Close the running loop's default pool, if any."""
    pool = _DEFAULT_POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.aclose()
