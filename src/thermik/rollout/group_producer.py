"""Asynchronous rollout: groups are generated continuously into a buffer while the trainer trains.

Versions are the engine's weight versions; the trainer's weights equal the engine's current version V when it
takes a batch (the weight sync follows every update). Staleness is bounded the way AReaL does it (Fu et al.
2025): group g (counting from 0 at start) may only *start* once the engine has advanced by at least
g // prompts_per_step - max_staleness versions, so at most (max_staleness + 1) batches are ever
in flight or buffered. The bound is also checked when a batch is taken: a group whose oldest token came from
version v with V - v > max_staleness (slow episodes overtaken by later ones) is dropped and counted,
never trained (counted: `async/dropped_groups|samples|tokens`).

Partial rollouts: a weight update does not stop a running group. Its episodes go on under the new weights (the
engine takes them between decode steps, docs/async.md), each token carrying the version that sampled it, so a
group's staleness is that of its oldest token, not of the version it started under. With `stale = "cancel"`,
in-flight groups whose start version (a lower bound of their oldest token's) can no longer meet the bound are
cancelled as soon as the weights advance instead of being finished and dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from thermik.data.sampler import PromptSampler
from thermik.rollout.staleness import staleness_metrics, token_staleness_metrics, within_staleness
from thermik.rollout.trajectory import Trajectory

GroupRollout = Callable[[dict[str, Any], int], Awaitable[list[Trajectory]]]
"""(dataset row, group index) -> the group's trajectories."""


@dataclass
class Group:
    index: int
    start_version: int
    trajectories: list[Trajectory]

    @property
    def sampled_versions(self) -> list[list[int]]:
        """Per trajectory, the weight version of each sampled token (observation tokens left out)."""
        return [[v for v in t.all_weight_versions if v >= 0] for t in self.trajectories]

    @property
    def oldest_version(self) -> int:
        """The oldest weight version behind any sampled token (tokens of observations carry -1)."""
        versions = [v for t in self.trajectories for v in t.all_weight_versions if v >= 0]
        return min(versions, default=self.start_version)


class GroupProducer:
    def __init__(
        self,
        rollout_group: GroupRollout,
        sampler: PromptSampler,
        prompts_per_step: int,
        max_staleness: int,
        version: Callable[[], int],
        stale: Literal["drop", "cancel"] = "drop",
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.rollout_group = rollout_group
        self.sampler = sampler
        self.prompts_per_step = prompts_per_step
        self.max_staleness = max_staleness
        self.version = version
        self.stale = stale
        self._cond = asyncio.Condition()
        self._ready: list[Group] = []
        self._inflight: dict[asyncio.Task[None], int] = {}  # task -> start version
        self._started = 0
        self._first_version = 0
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self.dropped_groups = 0
        self.dropped_samples = 0
        self.dropped_tokens = 0  # sampled tokens the staleness rule threw away
        self.cancelled_groups = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self, first_version: int | None = None) -> None:
        """Start producing; the first batch trains on weights `first_version` (default: the engine's now)."""
        self._first_version = self.version() if first_version is None else first_version
        self._task = asyncio.create_task(self._produce(), name="thermik-group-producer")

    async def stop(self) -> None:
        """Cancel the producer and every in-flight group."""
        tasks = [t for t in (self._task, *self._inflight) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()

    async def weights_updated(self) -> None:
        """Call after each weight sync: admits new groups and (stale = "cancel") cancels hopeless ones."""
        async with self._cond:
            if self.stale == "cancel":
                for task, start in list(self._inflight.items()):
                    if not within_staleness(start, self.version(), self.max_staleness):
                        task.cancel()
                        self.cancelled_groups += 1
            self._cond.notify_all()

    # ------------------------------------------------------------------ producing

    def _may_start(self) -> bool:
        # The next group trains step first_version + (its batch index) and starts on the current weights.
        train_step = self._first_version + self._started // self.prompts_per_step
        return within_staleness(self.version(), train_step, self.max_staleness)

    async def _produce(self) -> None:
        while True:
            async with self._cond:
                await self._cond.wait_for(self._may_start)
                row = self.sampler.next_batch(1)[0]
                index, start = self._started, self.version()
                self._started += 1
                task = asyncio.create_task(self._run_group(row, index, start))
                self._inflight[task] = start

    async def _run_group(self, row: dict[str, Any], index: int, start: int) -> None:
        try:
            trajectories = await self.rollout_group(row, index)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced to the trainer by next_batch
            async with self._cond:
                self._error = exc
                self._cond.notify_all()
            return
        finally:
            self._inflight.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
        async with self._cond:
            self._ready.append(Group(index, start, trajectories))
            self._cond.notify_all()

    # ------------------------------------------------------------------ consuming

    def _drop(self, group: Group) -> None:
        """The staleness rule throws `group` away: counted in groups, samples and sampled tokens."""
        self.dropped_groups += 1
        self.dropped_samples += len(group.trajectories)
        self.dropped_tokens += sum(len(vs) for vs in group.sampled_versions)

    async def next_batch(self, trainer_version: int | None = None) -> tuple[list[Group], dict[str, float]]:
        """The next prompts_per_step groups admissible for the weights they will train (`trainer_version`; default:
        the engine's current version, which a one-process run's trainer holds) (blocks until they exist)."""
        t0 = time.perf_counter()
        at = self.version() if trainer_version is None else trainer_version
        groups: list[Group] = []
        before = (self.dropped_groups, self.dropped_samples, self.dropped_tokens)
        fill = len(self._ready) / self.prompts_per_step
        while len(groups) < self.prompts_per_step:
            async with self._cond:
                await self._cond.wait_for(lambda: bool(self._ready) or self._error is not None)
                if self._error is not None:
                    raise RuntimeError(f"a rollout group failed: {self._error!r}") from self._error
                group = self._ready.pop(0)
            if not within_staleness(group.oldest_version, at, self.max_staleness):
                self._drop(group)
                continue
            groups.append(group)
        before_groups, before_samples, before_tokens = before
        return groups, {
            **staleness_metrics([at - g.oldest_version for g in groups]),
            **token_staleness_metrics([vs for g in groups for vs in g.sampled_versions], at),
            "async/dropped_groups": float(self.dropped_groups - before_groups),
            "async/dropped_samples": float(self.dropped_samples - before_samples),
            "async/dropped_tokens": float(self.dropped_tokens - before_tokens),
            "async/cancelled_groups_total": float(self.cancelled_groups),
            "async/buffer_fill": fill,
            "async/in_flight_groups": float(len(self._inflight)),
            "time/wait_batch": time.perf_counter() - t0,
        }
