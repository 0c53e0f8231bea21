"""MCPPool beyond the shared stdio session: streamable HTTP, per-rollout processes on private data copies,
bounded concurrency, per-server logs, and no orphan when the parent is SIGKILLed (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from fixtures.faulty_server import SCRIPT, server_spec
from orphans import earlier_children, new_children  # noqa: F401  (earlier_children: an autouse fixture)

from thermik.tools.mcp_pool import HttpServerSpec, MCPPool


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"HTTP MCP server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port}")


@pytest.mark.slow
def test_streamable_http_server(tmp_path):
    port = _free_port()
    log = open(tmp_path / "http.log", "w")  # noqa: SIM115 -- closed below
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--transport", "streamable-http", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
    )
    try:
        _wait_for_port(port, proc)
        spec = HttpServerSpec(url=f"http://127.0.0.1:{port}/mcp", name="faulty-http")

        async def main():
            pool = MCPPool(log_dir=tmp_path)
            try:
                names = [s["function"]["name"] for s in await pool.list_tools(spec)]
                results = await asyncio.gather(*(pool.call_tool(spec, "add", {"a": i, "b": 1}, 10) for i in range(5)))
                unknown = await pool.call_tool(spec, "nope", {}, 10)
                slow = await pool.call_tool(spec, "sleep", {"seconds": 5}, 0.3)
                return names, results, unknown, slow
            finally:
                await pool.aclose()

        names, results, unknown, slow = asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
    assert "echo" in names and "add" in names
    assert [r.text for r in results] == [str(i + 1) for i in range(5)]
    assert unknown.is_error and "nope" in unknown.text
    assert slow.is_error and "timed out" in slow.text


@pytest.mark.slow
def test_stateful_server_gets_a_fresh_process_on_a_private_copy_per_rollout(tmp_path):
    data = tmp_path / "counter.txt"
    data.write_text("10")
    spec = server_spec("--state-file", "{data_path}", data_path=str(data), name="counter")

    async def rollout(pool: MCPPool, crash: bool) -> tuple[list[str], str, Path]:
        async with pool.open_session(spec) as session:
            texts = [(await session.call_tool("increment", {}, 10)).text]
            pid = (await session.call_tool("pid", {}, 10)).text
            if crash:
                texts.append((await session.call_tool("crash", {}, 10)).text)
            texts.append((await session.call_tool("increment", {}, 10)).text)
            copy = session.data_copy
            assert copy is not None and copy.read_text() == texts[-1]
            return texts, pid, copy

    async def main():
        pool = MCPPool(log_dir=tmp_path)
        try:
            first, second = await asyncio.gather(rollout(pool, crash=False), rollout(pool, crash=True))
            return first, second, pool.errlog_paths
        finally:
            await pool.aclose()

    (texts_a, pid_a, copy_a), (texts_b, pid_b, copy_b), logs = asyncio.run(main())
    assert texts_a == ["11", "12"]  # each rollout starts from the original 10
    assert texts_b[0] == "11" and "connection lost" in texts_b[1] and texts_b[2] == "12"  # restart keeps the copy
    assert pid_a.isdigit() and pid_b.isdigit() and pid_a != pid_b  # one private process per rollout
    assert data.read_text() == "10"  # the original is never touched
    assert copy_a != copy_b and not copy_a.exists() and not copy_b.exists()
    assert logs["counter"].read_text().count("--- starting MCP server") == 3  # two rollouts + one restart
    assert _server_pids() == []


def test_pool_close_reaps_a_session_a_rollout_forgot_to_close(tmp_path):
    data = tmp_path / "counter.txt"
    data.write_text("0")
    spec = server_spec("--state-file", "{data_path}", data_path=str(data), name="forgotten")

    async def main():
        pool = MCPPool(log_dir=tmp_path)
        session = pool.open_session(spec)  # never closed by its "rollout"
        assert (await session.call_tool("increment", {}, 30)).text == "1"
        copy = session.data_copy
        await pool.aclose()
        return copy

    copy = asyncio.run(main())
    assert copy is not None and not copy.parent.exists()
    assert _server_pids() == []


@pytest.mark.slow
def test_calls_per_server_are_bounded_by_a_semaphore():
    async def timed(limit: int) -> float:
        pool = MCPPool(max_concurrent_calls=limit)
        spec = server_spec()
        try:
            await pool.call_tool(spec, "echo", {"text": "warm"}, 30)
            t0 = time.perf_counter()
            results = await asyncio.gather(*(pool.call_tool(spec, "sleep", {"seconds": 0.4}, 10) for _ in range(6)))
            assert not any(r.is_error for r in results)
            return time.perf_counter() - t0
        finally:
            await pool.aclose()

    assert asyncio.run(timed(2)) >= 3 * 0.4 - 0.05  # 6 calls, 2 at a time: three waves


def test_bad_pool_options_fail_fast():
    with pytest.raises(ValueError, match="max_concurrent_calls"):
        MCPPool(max_concurrent_calls=0)
    with pytest.raises(ValueError, match="max_output_chars"):
        MCPPool(max_output_chars=0)


def test_pool_logs_each_server_under_its_log_dir(tmp_path):
    async def main():
        pool = MCPPool(log_dir=tmp_path / "logs")  # what a run builds: logs under the run dir
        try:
            await pool.call_tool(server_spec(name="first"), "echo", {"text": "a"}, 30)
            return pool.errlog_paths
        finally:
            await pool.aclose()

    paths = asyncio.run(main())
    assert paths == {"first": tmp_path / "logs" / "mcp-first.log"}
    assert "--- starting MCP server" in paths["first"].read_text()


def _with_tests_on_path() -> dict[str, str]:
    """os.environ with tests/ on PYTHONPATH, so a child process imports fixtures.faulty_server."""
    tests = str(Path(__file__).resolve().parent)
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH", "")]))}


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, psutil
    from thermik.tools.mcp_pool import MCPPool
    from fixtures.faulty_server import server_spec

    async def main():
        pool = MCPPool()
        spec = server_spec()
        await pool.call_tool(spec, "echo", {"text": "up"}, 30)
        print(*[p.pid for p in psutil.Process().children(recursive=True)], flush=True)
        await pool.call_tool(spec, "block", {"seconds": 120}, 300)  # the server hangs; we get SIGKILLed

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_no_server_survives_a_sigkilled_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True, env=_with_tests_on_path()
    )
    try:
        line = parent.stdout.readline()
        server_pids = [int(p) for p in line.split()]
        assert server_pids, "the parent did not report its MCP server"
        time.sleep(0.3)  # let the `block` call reach the server
        assert all(psutil.pid_exists(pid) for pid in server_pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    deadline = time.monotonic() + 10
    alive = server_pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _running(pid)]
        time.sleep(0.05)
    for pid in alive:  # leave nothing behind even when the assertion below fails
        os.kill(pid, signal.SIGKILL)
    assert alive == [], "an MCP server outlived its SIGKILLed parent"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _server_pids() -> list[int]:
    return [p.pid for p in new_children()]
