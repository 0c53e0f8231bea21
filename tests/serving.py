"""Test helpers: run an ASGI app with uvicorn on a loopback port in a background thread; build served engines."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from thermik.inference.server.run import load_engine


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
