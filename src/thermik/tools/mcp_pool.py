"""MCPPool: MCP client sessions over stdio and streamable HTTP, shared or private per rollout.

Spawning and initializing a Python MCP server costs far more than a call, and one stdio
session multiplexes concurrent calls, so a stateless server is started once per pool
(lazily, inside the running event loop) and shared. A stateful server (`ServerSpec.data_path`
or `stateful=True`) gets a fresh process per rollout through `open_session`, pointed at a
private copy of its data, so no state leaks between rollouts.

anyio context managers (stdio_client, ClientSession) must be exited by the task that
entered them. Each connection therefore lives in its own owner task that enters both,
signals ready, waits for a stop event and exits them; callers in any task only send
requests on the session.

Faults never raise out of `call_tool`: a timeout, a dead server, a protocol error all return
ToolResult(is_error=True). A connection that died (or stopped answering pings after a
timeout) is retired in the background and a fresh one is started on the next call. Calls per
connection are bounded by a semaphore; outputs are cut to `max_output_chars`. On Linux a stdio
server is started through thermik.lifetime's exec wrapper (PR_SET_PDEATHSIG), so it dies with us
even when we are SIGKILLed (the SDK already starts it in its own process group and kills that
group on close).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from thermik.errors import ThermikError
from thermik.lifetime import dying_with_parent

logger = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 10_000
"""Tool outputs are cut to this many characters before they reach a prompt."""
DEFAULT_MAX_CONCURRENT_CALLS = 32
"""In-flight calls per server connection; more wait their turn."""
_PING_TIMEOUT_S = 2.0
_CLOSE_TIMEOUT_S = 10.0


class MCPServerError(ThermikError, RuntimeError):
    """An MCP server that cannot start: the message names its command and the cause (an OS error, its stderr log)."""


@dataclass(frozen=True)
class ServerSpec:
    """How to launch one stdio MCP server. Equal specs share one session (unless stateful).

    `data_path`: a file or directory copied into a fresh temp dir for each rollout; `{data_path}`
    (the copy) and `{data_dir}` (the temp dir) in `args`, `env` values and `cwd` are replaced by
    the copy's paths. A spec with `data_path` is stateful: one process per rollout.
    """

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables (the SDK passes only a safe subset of ours)."""
    name: str = ""
    """Short name for logs (`<log_dir>/mcp-<name>.log`); defaults to the command's base name."""
    cwd: str | None = None
    data_path: str | None = None
    stateful: bool = False

    @property
    def is_stateful(self) -> bool:
        return self.stateful or self.data_path is not None

    @property
    def label(self) -> str:
        return self.name or Path(self.args[1] if self.args[:1] == ("-m",) else self.command).name

    def params(self, data_copy: Path | None = None, kill_with_parent: bool = True) -> StdioServerParameters:
        fill = _placeholder_filler(data_copy)
        # A relative path ('.venvs/x/bin/server') means ours, not the server's cwd.
        command = os.path.abspath(self.command) if os.sep in self.command else self.command
        args = [fill(a) for a in self.args]
        if kill_with_parent:
            command, *args = dying_with_parent([command, *args])
        env = {k: fill(v) for k, v in self.env} or None
        cwd = fill(self.cwd) if self.cwd else None
        # "replace": a stray non-UTF-8 byte on the wire costs one bad line, not the whole connection.
        return StdioServerParameters(command=command, args=args, env=env, cwd=cwd, encoding_error_handler="replace")

    def __str__(self) -> str:
        return " ".join((self.command, *self.args))

    def check_command(self) -> None:
        """Raise MCPServerError naming the OS error when the command is not an executable file (the SDK would report
        only 'Connection closed')."""
        command = self.command
        path = os.path.abspath(command) if os.sep in command else shutil.which(command)
        if path is None or not os.path.exists(path):
            code = errno.ENOENT
        elif os.path.isdir(path) or not os.access(path, os.X_OK):
            code = errno.EACCES
        else:
            return
        raise MCPServerError(
            f"MCP server {self.label!r} cannot start: {command!r}: {os.strerror(code)}",
            hint="fix its command in env.mcp_servers (installed? on PATH?)",
        )


@dataclass(frozen=True)
class HttpServerSpec:
    """A running MCP server reached over streamable HTTP (e.g. `http://127.0.0.1:8000/mcp`)."""

    url: str
    name: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    is_stateful = False

    @property
    def label(self) -> str:
        return self.name or self.url

    def __str__(self) -> str:
        return self.url


AnyServerSpec = ServerSpec | HttpServerSpec


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool


def _placeholder_filler(data_copy: Path | None) -> Callable[[str], str]:
    def fill(value: str) -> str:
        if data_copy is None:
            return value
        return value.replace("{data_path}", str(data_copy)).replace("{data_dir}", str(data_copy.parent))

    return fill


def tool_specs(tools: list[Any]) -> list[dict[str, Any]]:
    """mcp `Tool` objects -> OpenAI function specs (what the chat template renders)."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description or "",
                "parameters": t.input_schema or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]


class _Connection:
    """One server process (or HTTP session) + initialized ClientSession, owned by a dedicated task."""

    def __init__(
        self, spec: AnyServerSpec, errlog: TextIO | None, max_calls: int, data_copy: Path | None, kill_with_parent: bool
    ) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self.broken = False
        self.semaphore = asyncio.Semaphore(max_calls)
        self._errlog = errlog
        self._data_copy = data_copy
        self._kill_with_parent = kill_with_parent
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float) -> None:
        self._task = asyncio.create_task(self._own(), name=f"mcp-server:{self.spec.label}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            await self.close()
            raise TimeoutError(f"MCP server did not initialize within {timeout_s:g}s: {self.spec}") from None
        if self.session is None:
            await self.close()
            log = f"; its stderr is in {self._errlog.name}" if self._errlog is not None else ""
            raise MCPServerError(f"MCP server failed to start: {self.spec}: {_root_cause(self._error)}{log}")

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        if isinstance(self.spec, HttpServerSpec):
            import httpx2  # the SDK's HTTP client (a dependency of mcp 2.x)

            async with (
                httpx2.AsyncClient(headers=dict(self.spec.headers)) as http,
                streamable_http_client(self.spec.url, http_client=http) as (read, write),
            ):
                yield read, write
        else:
            params = self.spec.params(self._data_copy, self._kill_with_parent)
            async with stdio_client(params, errlog=self._errlog or sys.stderr) as (read, write):
                yield read, write

    async def _own(self) -> None:
        try:
            async with self._transport() as (read, write), ClientSession(read, write) as session:
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


@dataclass
class _Private:
    """A per-rollout connection and the temp dir holding its data copy."""

    spec: ServerSpec
    conn: _Connection | None = None
    data_copy: Path | None = None
    temp_dir: Path | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class MCPPool:
    """MCP sessions keyed by server spec. Use inside one event loop; close with `aclose`."""

    def __init__(
        self,
        log_dir: str | Path | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_concurrent_calls: int = DEFAULT_MAX_CONCURRENT_CALLS,
        kill_with_parent: bool = True,
    ) -> None:
        if max_output_chars < 1 or max_concurrent_calls < 1:
            raise ValueError("max_output_chars and max_concurrent_calls must be >= 1")
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._startup_timeout_s = startup_timeout_s
        self._max_output_chars = max_output_chars
        self._max_calls = max_concurrent_calls
        self._kill_with_parent = kill_with_parent
        self._connections: dict[AnyServerSpec, _Connection] = {}
        self._locks: dict[AnyServerSpec, asyncio.Lock] = {}
        self._tools: dict[AnyServerSpec, list[Any]] = {}
        self._list_locks: dict[AnyServerSpec, asyncio.Lock] = {}
        self._errlogs: dict[str, TextIO] = {}
        self._errlog_paths: dict[str, Path] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._sessions: set[ToolSession] = set()  # open ones; a session left open is closed by aclose
        self._closed = False

    @property
    def log_dir(self) -> Path:
        """Directory receiving one `mcp-<name>.log` (the server's stderr) per server name."""
        if self._log_dir is None:
            self._log_dir = Path(tempfile.gettempdir()) / f"thermik-mcp-{os.getpid()}"
        return self._log_dir

    @property
    def errlog_path(self) -> Path | None:
        """Log file of the first server started (kept for callers that use one server)."""
        return next(iter(self.errlog_paths.values()), None)

    @property
    def errlog_paths(self) -> dict[str, Path]:
        """Server log name -> the file receiving that server's stderr."""
        return dict(self._errlog_paths)

    async def call_tool(
        self,
        spec: AnyServerSpec,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float,
        max_output_chars: int | None = None,
    ) -> ToolResult:
        """Call tool `name` on the shared session of `spec`. Never raises for tool, timeout or server failures.
        The output is cut to `max_output_chars` (default: the pool's)."""
        self._check_open()
        try:
            conn = await self._shared(spec)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            return ToolResult(text=f"tool server unavailable: {exc}", is_error=True)
        return await self._call(conn, name, arguments, timeout_s, max_output_chars)

    async def list_tools(self, spec: AnyServerSpec) -> list[dict[str, Any]]:
        """The server's tools as OpenAI function specs (cached per spec). Raises if the server cannot start."""
        self._check_open()
        async with self._list_locks.setdefault(spec, asyncio.Lock()):  # concurrent rollouts list once
            if spec not in self._tools:
                if spec.is_stateful:
                    async with self.open_session(spec) as session:
                        self._tools[spec] = await session.raw_tools()
                else:
                    self._tools[spec] = await _list_all(await self._shared(spec))
        return tool_specs(self._tools[spec])

    def open_session(self, spec: AnyServerSpec) -> ToolSession:
        """A per-rollout handle: a private process (and data copy) for a stateful spec, the shared one otherwise.
        Close it with `aclose` (or `async with`)."""
        self._check_open()
        session = ToolSession(self, spec)
        self._sessions.add(session)
        return session

    async def aclose(self) -> None:
        """Close every session and reap every server process. Idempotent."""
        self._closed = True
        await asyncio.gather(*(s.aclose() for s in list(self._sessions)), return_exceptions=True)
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(conn.close() for conn in connections), return_exceptions=True)
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for log in self._errlogs.values():
            log.close()
        self._errlogs.clear()

    # ------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MCPPool is closed")

    async def _call(
        self, conn: _Connection, name: str, arguments: dict[str, Any], timeout_s: float, max_chars: int | None = None
    ) -> ToolResult:
        async with conn.semaphore:
            session = conn.session
            if session is None or conn.broken:
                return ToolResult(text=f"tool server unavailable: {conn.spec.label} is not running", is_error=True)
            try:
                result = await session.call_tool(name, arguments, read_timeout_seconds=timeout_s)
            except (MCPError, TimeoutError) as exc:
                code = exc.code if isinstance(exc, MCPError) else REQUEST_TIMEOUT
                if code == REQUEST_TIMEOUT:
                    await self._check_alive(conn)
                    return ToolResult(text=f"tool '{name}' timed out after {timeout_s:g}s", is_error=True)
                if code != CONNECTION_CLOSED:  # the server answered (unknown tool, bad params): keep it
                    return ToolResult(text=f"tool '{name}' failed: {exc.message}", is_error=True)
                self._retire(conn)  # restarted on the next call
                lost = f"tool '{name}' failed: tool server connection lost ({exc.message})"
                return ToolResult(text=lost, is_error=True)
            except Exception as exc:  # transport torn down under us (closed/broken streams, bad bytes)
                self._retire(conn)
                return ToolResult(text=f"tool '{name}' failed: {type(exc).__name__}: {exc}", is_error=True)
        text = _content_text(result.content)
        return ToolResult(text=truncate(text, max_chars or self._max_output_chars), is_error=bool(result.is_error))

    async def _shared(self, spec: AnyServerSpec) -> _Connection:
        conn = self._connections.get(spec)
        if conn is not None and not conn.broken:
            return conn
        async with self._locks.setdefault(spec, asyncio.Lock()):
            conn = self._connections.get(spec)
            if conn is not None and not conn.broken:
                return conn  # another caller restarted it while we waited
            if conn is not None:
                del self._connections[spec]
                self._retire(conn)
            conn = await self._start(spec, None)
            self._connections[spec] = conn
            return conn

    async def _start(self, spec: AnyServerSpec, data_copy: Path | None) -> _Connection:
        if isinstance(spec, ServerSpec):
            spec.check_command()
        errlog = self._open_errlog(spec) if isinstance(spec, ServerSpec) else None
        conn = _Connection(spec, errlog, self._max_calls, data_copy, self._kill_with_parent)
        await conn.start(self._startup_timeout_s)
        return conn

    def _retire(self, conn: _Connection) -> None:
        """Close a dead or hung connection in the background; aclose waits for it."""
        conn.broken = True
        task = asyncio.create_task(conn.close())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _check_alive(self, conn: _Connection) -> None:
        """After a timeout: keep a slow-but-alive server, drop a hung one."""
        session = conn.session
        if session is None:
            self._retire(conn)
            return
        try:
            await asyncio.wait_for(session.send_ping(), _PING_TIMEOUT_S)
        except (MCPError, TimeoutError):
            self._retire(conn)

    def _open_errlog(self, spec: ServerSpec) -> TextIO:
        key = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.label)[:64] or "server"
        log = self._errlogs.get(key)
        if log is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self._errlog_paths[key] = self.log_dir / f"mcp-{key}.log"
            log = self._errlogs[key] = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 -- pool-long
            logger.info("MCP server %s: stderr goes to %s", spec.label, path)
        log.write(f"--- starting MCP server: {spec}\n")
        log.flush()
        return log


def _root_cause(error: BaseException | None) -> str:
    """The first leaf of nested exception groups (the SDK wraps a closed connection twice), as 'Type: message'."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}" if error is not None else "no error reported"


def _content_text(content: list[Any]) -> str:
    return "\n".join(getattr(b, "text", None) or f"[{getattr(b, 'type', 'unknown')} content]" for b in content)


def truncate(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` with a marker saying how much was dropped."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... [truncated {len(text) - max_chars} chars]"


async def _list_all(conn: _Connection) -> list[Any]:
    session = conn.session
    if session is None:
        raise RuntimeError(f"MCP server {conn.spec.label} is not running")
    tools: list[Any] = []
    cursor: str | None = None
    while True:
        from mcp_types import PaginatedRequestParams

        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


class ToolSession:
    """One rollout's view of one server: shared connection for stateless specs; for stateful ones a
    private process started on first use, restarted after a crash (same data copy), closed by `aclose`."""

    def __init__(self, pool: MCPPool, spec: AnyServerSpec) -> None:
        self.pool = pool
        self.spec = spec
        self._private = _Private(spec) if isinstance(spec, ServerSpec) and spec.is_stateful else None
        self._closed = False

    @property
    def data_copy(self) -> Path | None:
        """The rollout's private copy of `spec.data_path` (after the first call)."""
        return None if self._private is None else self._private.data_copy

    async def call_tool(
        self, name: str, arguments: dict[str, Any], timeout_s: float, max_output_chars: int | None = None
    ) -> ToolResult:
        """Like MCPPool.call_tool, on this rollout's connection. Never raises for server faults."""
        if self._closed:
            return ToolResult(text="tool session is closed", is_error=True)
        if self._private is None:
            return await self.pool.call_tool(self.spec, name, arguments, timeout_s, max_output_chars)
        try:
            conn = await self._private_connection()
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            return ToolResult(text=f"tool server unavailable: {exc}", is_error=True)
        return await self.pool._call(conn, name, arguments, timeout_s, max_output_chars)

    async def raw_tools(self) -> list[Any]:
        """The server's tools as mcp `Tool` objects, asked on this session's connection (uncached)."""
        if self._private is None:
            return await _list_all(await self.pool._shared(self.spec))
        return await _list_all(await self._private_connection())

    async def _private_connection(self) -> _Connection:
        private = self._private
        assert private is not None
        async with private.lock:
            if private.conn is not None and not private.conn.broken:
                return private.conn
            if private.conn is not None:
                self.pool._retire(private.conn)
            if private.temp_dir is None:
                private.temp_dir, private.data_copy = _copy_data(private.spec)
            private.conn = await self.pool._start(private.spec, private.data_copy)
            return private.conn

    async def aclose(self) -> None:
        """Stop the private process and delete the data copy. Idempotent; a shared connection stays up."""
        self._closed = True
        self.pool._sessions.discard(self)
        private = self._private
        if private is None:
            return
        async with private.lock:
            if private.conn is not None:
                await private.conn.close()
                private.conn = None
            if private.temp_dir is not None:
                shutil.rmtree(private.temp_dir, ignore_errors=True)
                private.temp_dir = None

    async def __aenter__(self) -> ToolSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _copy_data(spec: ServerSpec) -> tuple[Path, Path | None]:
    """(fresh temp dir, the copy of spec.data_path inside it or None)."""
    temp_dir = Path(tempfile.mkdtemp(prefix=f"thermik-{spec.label}-"))
    if spec.data_path is None:
        return temp_dir, temp_dir
    source = Path(spec.data_path)
    target = temp_dir / source.name
    try:
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target)
    except OSError as exc:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise OSError(f"cannot copy the data of MCP server {spec.label} from {source}: {exc}") from exc
    return temp_dir, target
