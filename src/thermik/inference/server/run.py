"""`thermik inference`: load a local model into the embedded engine and serve it with uvicorn."""

from __future__ import annotations

import asyncio
from pathlib import Path

from thermik.config.schema import ServeConfig

KEEP_ALIVE_S = 30  # uvicorn's default 5 s closes pooled client connections between RL steps


def serve(cfg: ServeConfig) -> None:
    import uvicorn

    from thermik.inference.embedded import EmbeddedEngine
    from thermik.inference.server.app import build_app
    from thermik.models.loading import load_model, load_tokenizer

    model = load_model(cfg.model.path, dtype=cfg.model.dtype, device=cfg.model.device).requires_grad_(False)
    tokenizer = load_tokenizer(cfg.model.path)
    stop_ids = sorted({tokenizer.eos_token_id, tokenizer.pad_token_id} - {None})
    engine = EmbeddedEngine(
        model,
        eos_token_ids=stop_ids,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        max_batch_size=cfg.inference.max_batch_size,
        seed=cfg.inference.seed,
    )
    s = cfg.server
    app = build_app(
        engine,
        tokenizer,
        model_name=s.served_model_name or Path(cfg.model.path).resolve().name,
        api_key=s.api_key or None,
        max_model_len=s.max_model_len or int(model.config.max_position_embeddings),
    )

    async def run() -> None:
        try:
            await uvicorn.Server(
                uvicorn.Config(
                    app,
                    host=s.host,
                    port=s.port,
                    log_level="info",
                    access_log=s.access_log,
                    timeout_keep_alive=KEEP_ALIVE_S,
                )
            ).serve()
        finally:
            await engine.close()

    asyncio.run(run())
