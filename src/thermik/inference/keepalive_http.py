"""A lean HTTP/1.1 client for JSON requests to one `http://` server over pooled keep-alive connections.

The remote backend sends one request per episode turn, hundreds per RL step, with up to a whole step's episodes
in flight. httpx spends milliseconds of CPU on each (its connection pool checks every pooled connection on every
request and every response close), which on a small machine is CPU the server's decode loop and the trainer do not
get (docs/process_split.md, "Measured"). This client writes the request and reads the reply over asyncio streams:
an idle connection is taken from a stack, used, and pushed back. It raises httpx's exception types, so callers
handle both clients alike. https and anything beyond a JSON request/reply (streaming, redirects, proxies) stay
with httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter, float]  # reader, writer, when it went idle


class Reply:
    """The parts of an httpx.Response the remote backend reads: status_code, json(), text."""

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class KeepAliveClient:
    """JSON requests to `base_url` (http only) over at most `max_connections` keep-alive connections; a connection
    idle longer than `keepalive_expiry_s` is closed instead of reused (the server may be closing it)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str],
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
        keepalive_expiry_s: float,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"KeepAliveClient serves http:// URLs, got {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.prefix = url.path.rstrip("/")
        host_header = url.netloc.rsplit("@", 1)[-1]
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head_tail = f"Host: {host_header}\r\n{extra}".encode("latin-1")
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def request(self, method: str, path: str, json: Any = None) -> Reply:
        """Send one request (a JSON body when `json` is given) and read the whole reply. A request that fails on a
        reused connection before any reply byte arrived raises httpx.ReadError/WriteError (safe to send again)."""
        body = b"" if json is None else jsonlib.dumps(json, separators=(",", ":")).encode()
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode("latin-1")
        if json is not None:
            head += b"Content-Type: application/json\r\n"
        message = head + self._head_tail + b"\r\n" + body
        async with self._slots:
            reader, writer = await self._connection()
            try:
                async with asyncio.timeout(self.timeout_s):
                    reply, keep = await self._exchange(reader, writer, message, method)
            except TimeoutError as exc:
                writer.close()
                raise httpx.ReadTimeout(f"no reply within {self.timeout_s:g} s") from exc
            except BaseException:
                writer.close()
                raise
            if keep:
                self._idle.append((reader, writer, time.monotonic()))
            else:
                writer.close()
            return reply

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        now = time.monotonic()
        while self._idle:
            reader, writer, since = self._idle.pop()
            if now - since < self.keepalive_expiry_s and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: bytes, method: str
    ) -> tuple[Reply, bool]:
        try:
            writer.write(message)
            await writer.drain()
        except OSError as exc:
            raise httpx.WriteError(f"sending the request failed: {exc}") from exc
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise httpx.ReadError("the server closed the connection before replying") from exc
        except (OSError, asyncio.LimitOverrunError) as exc:
            raise httpx.ReadError(f"reading the reply failed: {exc}") from exc
        status, headers = _parse_head(head)
        try:
            if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                content = b""
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                content = await _read_chunked(reader)
            elif "content-length" in headers:
                content = await reader.readexactly(int(headers["content-length"]))
            else:  # the body runs to the end of the connection
                return Reply(status, await reader.read()), False
        except (asyncio.IncompleteReadError, OSError, ValueError) as exc:
            raise httpx.RemoteProtocolError(f"the reply ended early: {exc}") from exc
        connection = headers.get("connection", "").lower()
        keep = connection == "keep-alive" if head.startswith(b"HTTP/1.0") else connection != "close"
        return Reply(status, content), keep

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer, _ in idle:
            writer.close()
        for _, writer, _ in idle:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)
