"""An inference engine as a Ray actor: an EmbeddedEngine behind async methods (Ray serves them concurrently,
so concurrent `generate` calls are batched by the engine exactly as in-process).

Weight versions are the trainer's: a restarted actor loads the current weights with `restore(weights, version)`
and reports versions from there, so every token keeps the version of the weights that sampled it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import torch

from thermik.assembly import components
from thermik.assembly.guards import checksum
from thermik.config.schema import RunConfig
from thermik.distributed import comm
from thermik.inference.base import Generation, SamplingParams


class EngineActor:
    def __init__(self, cfg: RunConfig, index: int) -> None:
        self.cfg, self.index = cfg, index
        policy, chat = components.load_policy(cfg.model)
        if cfg.distributed.backend == "nccl":
            policy.to(comm.device_for("nccl", cfg.model.device))
        self.engine = components.build_engine(policy, chat, cfg.inference)
        del policy
        self._version_offset = 0
        self._weights_group: comm.BroadcastGroup | None = None
        self._sleep_device: torch.device | None = None

    def pid(self) -> int:
        return os.getpid()

    def weight_version(self) -> int:
        return self.engine.weight_version + self._version_offset

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        gen = await self.engine.generate(prompt_ids, sampling)
        if self._version_offset:
            gen.weight_version += self._version_offset
            gen.weight_versions = [v + self._version_offset for v in gen.weight_versions]
        return gen

    async def update_weights(self, source: dict[str, torch.Tensor] | str, version: int | None = None) -> int:
        """Load a state dict (Ray resolves an ObjectRef argument) or a safetensors file or directory; `version`:
        report that version from now on (a resumed run's step)."""
        await self.engine.update_weights(Path(source) if isinstance(source, str) else source)
        return self._continue_at(version)

    async def restore(self, weights: dict[str, torch.Tensor] | str, version: int) -> int:
        """After a restart: load the weights of `version` and report that version from now on."""
        return await self.update_weights(weights, version)

    def _continue_at(self, version: int | None) -> int:
        if version is not None:
            self._version_offset = version - self.engine.weight_version
        return self.weight_version()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.engine.model.state_dict().items()}

    def checksums(self) -> dict[str, tuple[str, int]]:
        """{name: (dtype, exact checksum)} of the weights this engine holds (the weight checksum guard)."""
        state = self.engine.model.state_dict()
        return {k: (str(v.dtype).removeprefix("torch."), checksum(v)) for k, v in state.items()}

    # ------------------------------------------------------------------ collective weight sync

    async def join_weight_group(self, addr: str, port: int, rank: int, size: int) -> None:
        dc = self.cfg.distributed
        self._weights_group = await asyncio.to_thread(
            comm.BroadcastGroup.join, dc.backend, addr, port, rank, size, dc.timeout_s
        )

    async def receive_weights(self, spec: comm.WeightSpec, version: int | None = None) -> int:
        """Receive one broadcast from trainer rank 0 and copy it in (waits for the running batch)."""
        assert self._weights_group is not None, "join_weight_group first"
        state = await asyncio.to_thread(comm.receive_state, self._weights_group, spec, self.engine.device)
        await self.engine.update_weights(state)
        return self._continue_at(version)

    # ------------------------------------------------------------------ colocated mode

    async def sleep(self) -> None:
        """Colocated on a GPU: move the weights to host memory while the trainer trains (no-op on CPU)."""
        if self.engine.device.type == "cuda":
            self._sleep_device = self.engine.device
            self.engine.model.to("cpu")
            torch.cuda.empty_cache()

    async def wake_up(self) -> None:
        if self._sleep_device is not None:
            self.engine.model.to(self._sleep_device)
            self._sleep_device = None
