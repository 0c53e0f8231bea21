"""The remote backend's lean keep-alive HTTP client against real servers on loopback: a raw asyncio server that
answers in the framings HTTP/1.1 allows (content-length, chunked, close-delimited), and a `thermik inference`-style
app under uvicorn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import embedded_engine, running

from thermik.inference.base import SamplingParams
from thermik.inference.keepalive_http import KeepAliveClient
from thermik.inference.remote import RemoteEngine
from thermik.inference.server.app import build_app

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = next(int(line.split(":")[1]) for line in head.split("\r\n") if line.lower().startswith("content-length"))
    return head, await reader.readexactly(length)


def _serve(handler: Handler, requests: Callable[[KeepAliveClient], Awaitable[Any]], **kw: Any) -> tuple[Any, int]:
    """Run `requests` against a raw server whose connections `handler` serves; (their result, connections)."""
    connections = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await handler(reader, writer, connections)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> Any:
        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = {"timeout_s": 10.0, "connect_timeout_s": 5.0, "max_connections": 8, "keepalive_expiry_s": 5.0}
        client = KeepAliveClient(f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer k"}, **settings | kw)
        try:
            return await requests(client)
        finally:
            await client.aclose()
            server.close()

    result = asyncio.run(main())
    return result, connections


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    """Keep-alive: answer every request with its request line, auth header and body, length-delimited."""
    while True:
        head, body = await _read_request(reader)
        auth = next(line for line in head.split("\r\n") if line.lower().startswith("authorization"))
        reply = json.dumps({"line": head.split("\r\n")[0], "auth": auth, "body": json.loads(body or b"null")}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(reply))
        writer.write(reply)
        await writer.drain()


def test_requests_reuse_pooled_connections_and_carry_method_path_headers_and_json() -> None:
    async def requests(client: KeepAliveClient) -> list[Any]:
        replies = []
        for wave in range(5):  # 5 waves of 4 concurrent requests: at most 4 connections, reused
            batch = [client.request("POST", f"/v1/x?{wave}-{i}", json={"n": i}) for i in range(4)]
            replies += [r.json() for r in await asyncio.gather(*batch)]
        replies.append((await client.request("GET", "/health")).json())
        return replies

    replies, connections = _serve(_echo, requests)
    assert replies[0] == {"line": "POST /v1/x?0-0 HTTP/1.1", "auth": "Authorization: Bearer k", "body": {"n": 0}}
    assert replies[-1]["line"] == "GET /health HTTP/1.1" and replies[-1]["body"] is None
    assert len(replies) == 21 and connections == 4


def test_chunked_and_close_delimited_replies_are_read_whole() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _read_request(reader)
        if n == 1:  # chunked, with a chunk extension and a trailer; the connection stays open
            writer.write(b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(b'4;x=y\r\n{"a"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\nx-trailer: 1\r\n\r\n')
            await writer.drain()
            await _read_request(reader)
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\n\r\nboom")  # no length: to EOF
        await writer.drain()

    async def requests(client: KeepAliveClient) -> list[tuple[int, str]]:
        return [((r := await client.request("POST", "/", json={})).status_code, r.text) for _ in range(3)]

    replies, connections = _serve(handler, requests)
    assert replies == [(201, '{"a": 1}'), (500, "boom"), (500, "boom")]
    assert connections == 2  # the close-delimited reply ended its connection; the next request opened a new one


def test_a_connection_idle_past_the_expiry_is_not_reused() -> None:
    async def requests(client: KeepAliveClient) -> None:
        await client.request("GET", "/")
        await asyncio.sleep(0.3)
        await client.request("GET", "/")

    _, fresh = _serve(_echo, requests, keepalive_expiry_s=0.1)
    _, reused = _serve(_echo, requests, keepalive_expiry_s=5.0)
    assert (fresh, reused) == (2, 1)


def test_failures_raise_httpx_errors_the_remote_backend_handles() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _read_request(reader)

    async def one(client: KeepAliveClient) -> Any:
        return await client.request("GET", "/")

    with pytest.raises(httpx.ReadTimeout):
        _serve(silent, one, timeout_s=0.2)
    with pytest.raises(httpx.ReadError, match="closed the connection before replying"):
        _serve(hang_up, one)
    with pytest.raises(ValueError, match="http://"):
        KeepAliveClient("https://example.com", headers={}, timeout_s=1, connect_timeout_s=1, max_connections=1,
                        keepalive_expiry_s=1)  # fmt: skip


def test_remote_engine_over_the_lean_client_matches_httpx(tiny_model_dir: Path) -> None:
    """The same sampled tokens through the lean client (http://) and through httpx, from a real server."""
    engine, tokenizer = embedded_engine(tiny_model_dir)
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("2+2=", "abc", "x")]
    sampling = [SamplingParams(max_tokens=8, temperature=1.0, seed=i) for i in range(3)]

    async def sample(url: str, lean: bool) -> list[list[int]]:
        remote = RemoteEngine(url, api_key="k3y", stop_token_ids=())
        try:
            if not lean:  # the client https URLs get
                remote._client = httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer k3y"})
                remote._client_loop = asyncio.get_running_loop()
            gens = await asyncio.gather(*(remote.generate(p, s) for p, s in zip(prompts, sampling, strict=True)))
            assert isinstance(remote._client, KeepAliveClient) == lean
            return [g.token_ids for g in gens]
        finally:
            await remote.close()

    with running(build_app(engine, tokenizer, "tiny", api_key="k3y"), on_exit=engine.close) as url:
        lean, plain = asyncio.run(sample(url, True)), asyncio.run(sample(url, False))
    assert lean == plain and all(lean)
