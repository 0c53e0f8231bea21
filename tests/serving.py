"""Test helpers: run an ASGI app with uvicorn on a loopback port in a background thread; build served engines."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from conftest import cli_env, thermik_argv

from thermik.inference.server.run import load_engine


def free_port() -> int:
    """A loopback port free now (for a server whose port must be known before it starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_engine(model_dir: Path, seed: int = 0) -> tuple[Any, Any]:
    """(engine, tokenizer) over the model in `model_dir`, built exactly as `thermik inference` builds them."""
    return load_engine(model_dir, seed=seed)


@contextmanager
def running(app: Any, on_exit: Callable[[], Awaitable[None]] | None = None) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) until the block ends; yields the base URL. `on_exit` runs in the
    server's event loop after it stops (e.g. `engine.close`)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))

    async def main() -> None:
        try:
            await server.serve()
        finally:
            if on_exit is not None:
                await on_exit()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True, name="uvicorn-test-server")
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def start_thermik_inference(log: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """`thermik inference ARGS` as a user starts it (add `--server.port 0` for a free port); returns the process
    and the base URL read from its log."""
    argv = thermik_argv("inference", *args)
    proc = subprocess.Popen(argv, env=cli_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        match = re.search(r"Uvicorn running on (http://[\d.]+:\d+)", log.read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"thermik inference did not start:\n{log.read_text(errors='replace')}")
