"""`thermik inference`: load a local model into the embedded engine and serve it with uvicorn."""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
from pathlib import Path
from typing import Any

from thermik.config.schema import ServeConfig, ServerConfig
from thermik.errors import ThermikError

KEEP_ALIVE_S = 30  # uvicorn's default 5 s closes pooled client connections between RL steps
SWITCH_INTERVAL_S = 0.0005


def use_short_switch_interval() -> None:
    """A serving process's HTTP handlers and its decode thread share one interpreter lock, and a request waits for
    the decode thread to hand it over: up to Python's default switch interval (5 ms) per hand-off, many per request.
    0.5 ms made split-mode steps about 1.25x faster in paired probes (docs/process_split.md, "Measured")."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def load_engine(
    model_path: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    max_batch_size: int = 256,
    seed: int = 0,
    kv_cache_gb: float | None = None,
    num_threads: int = 0,
    precision: str = "model",
    inflight_kv: str = "keep",
) -> tuple[Any, Any]:
    """(embedded engine, HF tokenizer) for the model in `model_path`, stopping at the tokenizer's eos and pad,
    sampling in `precision` (cpu/engine_precision.py's rule; `thermik inference` passes inference.precision, as every
    run mode does).

    The one place the server builds its engine (tests use it too).
    """
    from thermik.inference.embedded import embedded_engine
    from thermik.models.loading import load_model, load_tokenizer

    model = load_model(model_path, dtype=dtype, device=device).requires_grad_(False)
    tokenizer = load_tokenizer(model_path)
    stop_ids = sorted({tokenizer.eos_token_id, tokenizer.pad_token_id} - {None})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine = embedded_engine(
        model,
        eos_token_ids=stop_ids,
        pad_token_id=pad,
        max_batch_size=max_batch_size,
        seed=seed,
        detokenize=tokenizer.decode,
        kv_cache_gb=kv_cache_gb,
        num_threads=num_threads,
        precision=precision,
        inflight_kv=inflight_kv,
    )
    return engine, tokenizer


class PortInUseError(ThermikError):
    """The server's port is taken: named with the setting that moves it."""


def check_port_free(server: ServerConfig) -> None:
    """Raise PortInUseError when server.host:server.port cannot be bound (before any model is loaded)."""
    if server.port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in server.host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT does not count
        try:
            sock.bind((server.host, server.port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            raise PortInUseError(
                f"server.port {server.port} on {server.host} is in use (address already in use)",
                hint="stop what listens there or set --server.port to a free port (and inference.base_url to match)",
            ) from err


def serve_engine(cfg: ServeConfig) -> tuple[Any, Any]:
    """(engine, tokenizer) of `thermik inference` for `cfg`: its model in inference.precision, the precision a
    `thermik rl` of the same config samples in locally."""
    m, inference = cfg.model, cfg.inference
    return load_engine(
        m.path,
        m.dtype,
        m.device,
        inference.max_batch_size,
        inference.seed,
        inference.kv_cache_gb,
        num_threads=inference.num_threads,
        precision=inference.precision,
        inflight_kv=inference.inflight_kv,
    )


def serve(cfg: ServeConfig) -> None:
    import uvicorn

    from thermik.inference.server.app import build_app

    check_port_free(cfg.server)
    use_short_switch_interval()
    engine, tokenizer = serve_engine(cfg)
    s = cfg.server
    app = build_app(
        engine,
        tokenizer,
        model_name=s.served_model_name or Path(cfg.model.path).resolve().name,
        api_key=s.api_key or None,
        max_model_len=s.max_model_len or int(engine.model.config.max_position_embeddings),
    )

    async def run() -> None:
        config = uvicorn.Config(
            app, host=s.host, port=s.port, log_level="info", access_log=s.access_log, timeout_keep_alive=KEEP_ALIVE_S
        )
        try:
            await uvicorn.Server(config).serve()
        finally:
            await engine.close()

    asyncio.run(run())
