"""The API an RL loop calls to train on Ray: start, update, sync weights, checkpoint, shut down.

    run = start(cfg)                           # Ray, placement group, trainer workers, engine actors
    trajs = await rollout_rows(run.engines, ...)   # run.engines is an InferenceEngine
    metrics = await run.update(batch, step)    # the learner step (train_on_batch) on every trainer worker
    version, seconds = await run.sync_weights()
    bad = await run.weight_mismatches()        # the consistency guards' view of engines vs trainer
    run.trainer.save_checkpoint(step, extra)    # rank 0 writes, atomically
    run.shutdown()

A dead trainer worker ends the run: `TrainerWorkerError` names the rank and the last complete checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thermik.config.schema import DistributedConfig, RunConfig
from thermik.distributed.engine_pool import EnginePool
from thermik.distributed.placement import actor_options, create_placement_group, plan_placement
from thermik.inference.base import next_version
from thermik.lifetime import child_pids, start_reaper
from thermik.training.batch import TokenBatch
from thermik.training.checkpoint import CheckpointManager
from thermik.training.run_checkpoint import CheckpointWriteFailure, on_write_error


class TrainerWorkerError(RuntimeError):
    """A trainer worker died or raised; the run is stopped and its checkpoints are left as they were."""


def init_ray(cfg: DistributedConfig, num_cpus: int | None = None) -> None:
    """Join `cfg.ray_address` ("auto" after `ray start`) or start a local Ray; no-op if Ray is already up. Every
    process of a local Ray ends within seconds of this process, however it ends (thermik.lifetime.start_reaper)."""
    try:
        import ray
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "thermik.distributed needs Ray: pip install 'thermik[distributed]' (ray==2.60.0)"
        ) from err

    if ray.is_initialized():
        return
    if cfg.ray_address:
        ray.init(address=cfg.ray_address)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster needs no token
    before = child_pids(os.getpid())
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    # Ray's raylet starts agents and workers that outlive it when this driver is SIGKILLed: a watchdog ends them.
    start_reaper(child_pids(os.getpid()) - before)


def _remote(cls: type, **options: Any) -> Any:
    import ray

    return ray.remote(cls).options(**options)


class DistributedTrainer:
    """The data-parallel trainer workers; `update` runs the learner step on every rank (each trains its shard) and
    returns the single-process metrics."""

    def __init__(self, cfg: RunConfig, workers: list[Any]) -> None:
        self.cfg = cfg
        self.workers = workers
        self.checkpoints = CheckpointManager(cfg.run_dir / "checkpoints", keep=cfg.checkpoint.keep)

    @classmethod
    def start(cls, cfg: RunConfig, pg: Any, slots: list[Any]) -> DistributedTrainer:
        from thermik.distributed.trainer_worker import TrainerWorker

        world = len(slots)
        workers = [
            _remote(TrainerWorker, **actor_options(slot, pg, max_restarts=0)).remote(cfg, rank, world)
            for rank, slot in enumerate(slots)
        ]
        trainer = cls(cfg, workers)
        addr, port = trainer._get([workers[0].endpoint.remote()])[0]
        trainer._get([w.setup.remote(addr, port) for w in workers])
        return trainer

    def _get(self, refs: list[Any]) -> list[Any]:
        """ray.get on one call per worker; on the first failure stop every worker and raise TrainerWorkerError."""
        import ray

        pending = dict(zip(refs, range(len(refs)), strict=True))
        results: dict[int, Any] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(done[0])
            try:
                results[rank] = ray.get(done[0])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                self.shutdown()
                latest = self.checkpoints.latest()
                where = f"the last complete checkpoint is {latest}" if latest else "no checkpoint was written yet"
                raise TrainerWorkerError(
                    f"trainer worker rank {rank} of {len(self.workers)} failed ({type(err).__name__}: "
                    f"{str(err).splitlines()[0]}); the run is stopped and {where}. "
                    "To continue from it, run it again (checkpoint.resume = true)."
                ) from err
        return [results[r] for r in range(len(refs))]

    def update(
        self, batch: TokenBatch, step: int, asynchronous: bool = False, cfg: RunConfig | None = None
    ) -> dict[str, float]:
        """train_on_batch on every rank (ranks merge their metrics: rank 0's are the update's). cfg: this update's
        config instead of the run's (tests vary the reduction and mini-batches)."""
        return self._get([w.update.remote(batch, step, asynchronous, cfg) for w in self.workers])[0]

    def grads(self) -> dict[str, Any]:
        return self._get([w.grads.remote() for w in self.workers])[0]

    def state_dict(self) -> dict[str, Any]:
        return self._get([w.state_dict.remote() for w in self.workers])[0]

    def save_checkpoint(self, step: int, extra: dict[str, Any]) -> Path | None:
        """checkpoints/step_<step> by the one writer of every mode (rank 0 writes); a failed write stops the run or
        goes on without it as checkpoint.on_write_error says (None then)."""
        written = self._get([w.save_checkpoint.remote(step, extra) for w in self.workers])[0]
        if isinstance(written, CheckpointWriteFailure):
            on_write_error(self.cfg.checkpoint, written)
            return None
        return Path(written)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        return self._get([w.load_checkpoint.remote(str(path)) for w in self.workers])[0]

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w, no_restart=True)


@dataclass
class DistributedRun:
    cfg: RunConfig
    trainer: DistributedTrainer
    engines: EnginePool
    placement_group: Any
    weight_sync_s: float = 0.0
    _spec: Any = None  # names, shapes, dtypes of the broadcast weights (fixed for a run)
    _group_epoch: int = -1  # engines.num_restarts when the weight group was formed; -1: not formed

    async def update(self, batch: TokenBatch, step: int, asynchronous: bool = False) -> dict[str, float]:
        """The learner step on the trainer workers, in a thread (asynchronous rollouts go on meanwhile). Colocated
        engines sleep meanwhile (free GPU memory; no-op on CPU), unless they keep generating (asynchronous)."""
        colocated = self.cfg.distributed.placement == "colocated" and not asynchronous
        if colocated:
            await asyncio.gather(*(a.sleep.remote() for a in self.engines.actors))
        try:
            return await asyncio.to_thread(self.trainer.update, batch, step, asynchronous)
        finally:
            if colocated:
                await asyncio.gather(*(a.wake_up.remote() for a in self.engines.actors))

    async def sync_weights(self, method: str | None = None, version: int | None = None) -> tuple[int, float]:
        """Trainer weights -> every engine by `method` (default distributed.weight_sync): "collective" broadcast
        or safetensors "files"; returns (new version, seconds). `version`: the version the engines report from now
        on (a resumed run's step), else the next one."""
        t0 = time.perf_counter()
        method = method or self.cfg.distributed.weight_sync
        if method not in ("collective", "files"):
            raise ValueError(f"unknown weight sync method {method!r}; valid: 'collective', 'files'")
        if not self.engines.actors:
            return self.engines.version, 0.0
        if method == "files":
            version = await self._sync_by_files(version)
        else:
            version = await self._sync_by_broadcast(version)
        self.weight_sync_s = time.perf_counter() - t0
        return version, self.weight_sync_s

    async def _sync_by_files(self, version: int | None) -> int:
        dc = self.cfg.distributed
        root = Path(dc.weights_dir) if dc.weights_dir else self.cfg.run_dir / "weights"
        target = root / f"version_{next_version(self.engines.version, version)}.safetensors"
        paths = await asyncio.gather(*(w.save_weights.remote(str(target)) for w in self.trainer.workers))
        previous = self.engines.restore_source
        version = await self.engines.update_weights(paths[0], version)
        if isinstance(previous, str) and previous != paths[0]:
            Path(previous).unlink(missing_ok=True)  # every engine holds the new version now
        return version

    async def _sync_by_broadcast(self, version: int | None) -> int:
        actors = self.engines.actors
        if self._group_epoch != self.engines.num_restarts:  # first sync, or a restarted engine left the group
            await self._form_weight_group()
        if self._spec is None:
            self._spec = await self.trainer.workers[0].weight_spec.remote()
        sends = [w.broadcast_weights.remote() for w in self.trainer.workers]
        versions = await asyncio.gather(*(a.receive_weights.remote(self._spec, version) for a in actors))
        await asyncio.gather(*sends)
        rank0 = self.trainer.workers[0]
        self.engines.set_current(lambda: rank0.synced_weights.remote(), versions[0])
        return versions[0]

    async def weight_mismatches(self) -> tuple[list[str], int]:
        """(tensors some engine holds unlike the trainer last sent them, tensors sent): exact checksums computed
        where the weights live (each engine actor, trainer rank 0), compared here in the engine's dtype."""
        held = await asyncio.gather(*(a.checksums.remote() for a in self.engines.actors))
        dtypes = {name: dtype for name, (dtype, _) in held[0].items()} if held else {}
        sent = await self.trainer.workers[0].synced_checksums.remote(dtypes)
        bad = [
            f"{name} (engine {i}{', absent' if name not in engine else ''})"
            for i, engine in enumerate(held)
            for name, value in sent.items()
            if engine.get(name, (None, None))[1] != value
        ]
        return bad, len(sent)

    async def score(self, ids: list[int]) -> list[float]:
        """Trainer rank 0's logprob of each next token of `ids`."""
        return await self.trainer.workers[0].score.remote(ids)

    async def _form_weight_group(self) -> None:
        actors = self.engines.actors
        addr, port = await self.trainer.workers[0].endpoint.remote()
        size = len(actors) + 1
        joins = [self.trainer.workers[0].join_weight_group.remote(addr, port, size)]
        joins += [a.join_weight_group.remote(addr, port, i + 1, size) for i, a in enumerate(actors)]
        await asyncio.gather(*joins)
        self._group_epoch = self.engines.num_restarts

    def shutdown(self) -> None:
        """Kill every actor and release the placement group; safe to call twice."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.placement_group is None:
            return
        self.trainer.shutdown()
        for a in self.engines.actors:
            ray.kill(a, no_restart=True)
        remove_placement_group(self.placement_group)
        self.placement_group = None


def start(cfg: RunConfig) -> DistributedRun:
    """Reserve the placement group, start trainer workers (a torch.distributed group) and engine actors."""
    from thermik.distributed.engine_actor import EngineActor

    dc = cfg.distributed
    init_ray(dc)
    plan = plan_placement(dc)
    pg = create_placement_group(plan)
    opts = {"max_restarts": dc.engine_max_restarts, "max_task_retries": 0}
    actors = [
        _remote(EngineActor, **actor_options(slot, pg, **opts)).remote(cfg, i) for i, slot in enumerate(plan.engines)
    ]
    trainer = DistributedTrainer.start(cfg, pg, plan.trainers)
    return DistributedRun(cfg, trainer, EnginePool(actors), pg)
