"""The engine actors seen from the driver as one InferenceEngine, with restart-and-resubmit on actor death.

Requests go to the engine with the fewest in flight. When an actor dies (ray.kill, OOM, a crashed node) Ray
restarts it (max_restarts); the pool waits until it answers, loads the current weights into it with
`restore(weights, version)` and resubmits every request that was in flight on it. A request is resubmitted
from its prompt: the tokens the dead actor had sampled are lost, never half-kept.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from thermik.inference.base import Generation, SamplingParams, WeightSource


class EngineLostError(RuntimeError):
    """An engine actor died and could not be brought back (max_restarts exhausted or restart timed out)."""


@dataclass
class _Slot:
    actor: Any
    in_flight: int = 0
    epoch: int = 0  # bumped on every recovery; a failed request from an older epoch just resubmits
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class EnginePool:
    """InferenceEngine over Ray engine actors. `restore_source` says what a restarted actor loads: the path of the
    current safetensors file, or a function returning an ObjectRef of the current weights; `version` is the
    current weight version."""

    def __init__(self, actors: list[Any], restart_timeout_s: float = 120.0, max_resubmits: int = 3) -> None:
        self._slots = [_Slot(a) for a in actors]
        self.restart_timeout_s = restart_timeout_s
        self.max_resubmits = max_resubmits
        self.restore_source: Any = None
        self.version = 0
        self.num_restarts = 0
        self.num_resubmitted = 0

    @property
    def actors(self) -> list[Any]:
        return [s.actor for s in self._slots]

    @property
    def weight_version(self) -> int:
        return self.version

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation:
        from ray.exceptions import RayActorError

        if not self._slots:
            raise RuntimeError("no engine actors to generate with: distributed.num_engines is 0")
        for attempt in range(self.max_resubmits + 1):
            slot = min(self._slots, key=lambda s: s.in_flight)
            epoch = slot.epoch
            slot.in_flight += 1
            try:
                return await slot.actor.generate.remote(list(prompt_ids), sampling)
            except RayActorError as err:
                if attempt == self.max_resubmits:
                    raise EngineLostError(f"engine request failed {attempt + 1} times; last error: {err}") from err
                await self._recover(slot, epoch, err)
                self.num_resubmitted += 1
            finally:
                slot.in_flight -= 1
        raise AssertionError("unreachable")

    async def _recover(self, slot: _Slot, failed_epoch: int, err: Exception) -> None:
        """Once per death: wait for Ray's restart, then load the current weights and version into the actor."""
        async with slot.lock:
            if slot.epoch != failed_epoch:
                return  # another request already recovered this actor
            deadline = time.monotonic() + self.restart_timeout_s
            while True:
                try:
                    await slot.actor.pid.remote()
                    break
                except Exception as ping_err:
                    if time.monotonic() > deadline or "max_restarts" in str(ping_err):
                        raise EngineLostError(
                            f"engine actor did not come back within {self.restart_timeout_s:.0f} s after {err!r}; "
                            "raise distributed.engine_max_restarts or check the Ray logs"
                        ) from ping_err
                    await asyncio.sleep(0.2)
            if self.restore_source is not None:
                source = self.restore_source() if callable(self.restore_source) else self.restore_source
                await slot.actor.restore.remote(source, self.version)
            slot.epoch += 1
            self.num_restarts += 1

    async def update_weights(self, source: WeightSource, version: int | None = None) -> int:
        """Every engine loads `source`: a safetensors path (weight_sync = files), or a state dict from this process,
        put once in Ray's object store (what the single-process RL loop pushes). Kept for restarts. `version`: the
        version the engines report from now on (a resumed run's step)."""
        import ray

        shared = ray.put(source) if isinstance(source, dict) else str(source)
        versions = await asyncio.gather(*(s.actor.update_weights.remote(shared, version) for s in self._slots))
        self.set_current(shared, versions[0])
        return self.version

    def set_current(self, restore_source: Any, version: int) -> None:
        self.restore_source, self.version = restore_source, version

    async def close(self) -> None:
        import ray

        for s in self._slots:
            ray.kill(s.actor, no_restart=True)
