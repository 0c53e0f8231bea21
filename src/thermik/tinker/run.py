"""Build the Tinker service from its config and serve it with uvicorn (`thermik tinker`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import FastAPI

from thermik.atomic import writable_dir
from thermik.models.loading import load_tokenizer
from thermik.tinker.api import Served, TinkerAPI
from thermik.tinker.api_weights import WeightsAPI
from thermik.tinker.app import build_app, model_directory
from thermik.tinker.config import TinkerConfig
from thermik.tinker.sampler import Samplers
from thermik.tinker.service import Service
from thermik.tinker.store import Store
from thermik.tinker.trainer import Trainer
from thermik.training.mixed_precision import autocast_dtype

KEEP_ALIVE_S = 75  # longer than the SDK's 45 s long polls, so pooled connections stay open


@dataclass
class Built:
    app: FastAPI
    service: Service

    async def close(self) -> None:
        self.service.close()
        await self.service.samplers.close()
        self.service.store.close()


def build(cfg: TinkerConfig) -> Built:
    directory = model_directory(cfg.model.path)
    state = writable_dir(cfg.service.state_dir, "--service.state_dir")
    autocast = autocast_dtype(cfg.model)
    trainer = Trainer(directory, cfg.model.dtype, cfg.model.device, autocast, cfg.model.lm_head_precision)
    samplers = Samplers(trainer.plain, load_tokenizer(directory), cfg.service.max_sampler_engines, cfg.model.seed)
    service = Service(Store(state / "tinker.sqlite"), trainer, samplers, cfg.service.num_threads)
    served = Served(
        name=cfg.server.base_model_name or str(directory),
        directory=directory,
        arch=str(trainer.plain.config.model_type),
        vocab_size=trainer.vocab_size,
        max_len=trainer.max_len,
        max_rank=cfg.service.max_lora_rank,
    )
    api = TinkerAPI(service, served)
    weights = WeightsAPI(api, state / "checkpoints")
    return Built(build_app(api, weights, cfg.server.api_key, cfg.service.poll_s), service)


def serve(cfg: TinkerConfig) -> None:
    import uvicorn

    built = build(cfg)
    s = cfg.server

    async def run() -> None:
        config = uvicorn.Config(
            built.app, host=s.host, port=s.port, log_level="info", access_log=s.access_log,
            timeout_keep_alive=KEEP_ALIVE_S,
        )  # fmt: skip
        try:
            await uvicorn.Server(config).serve()
        finally:
            await built.close()

    asyncio.run(run())
