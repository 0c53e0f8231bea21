"""The Tinker service: accepts requests as futures, runs training work on one worker thread, samples on engines.

Training requests of one model run in submission order. The worker takes the oldest job; a `forward_backward`
also takes every later queued `forward_backward` of the same model with the same loss, up to that model's next
other request (`optim_step`, `load_weights`, saves: barriers), and runs them as one batch. Futures and their
results live in SQLite (`store.py`); a request repeated with the same idempotency key gets the first one's future.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from thermik.tinker import wire
from thermik.tinker.sampler import Samplers
from thermik.tinker.store import FutureRow, Store
from thermik.tinker.trainer import FwdBwdPart, Trainer

JSON = "application/json"


class UserError(ValueError):
    """A request the server refuses (HTTP 4xx, or a failed future in the user's category)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Job:
    request_id: str
    model_id: str
    kind: str  # create_model | fwdbwd | optim | save | save_sampler | load | unload
    run: Callable[[], tuple[str, bytes]] | None = None  # every kind but fwdbwd
    fwdbwd: wire.FwdBwdRequest | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def ok(value: dict[str, Any]) -> tuple[str, bytes]:
    return JSON, json.dumps(value).encode()


class Service:
    def __init__(self, store: Store, trainer: Trainer, samplers: Samplers, num_threads: int = 0) -> None:
        self.store, self.trainer, self.samplers, self.num_threads = store, trainer, samplers, num_threads
        self._queue: list[Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}
        self._waiters_lock = threading.Lock()
        self._tasks: set[asyncio.Task] = set()
        for request_id in store.pending_ids():  # accepted by an earlier server process that died before finishing
            self._finish(request_id, "failed", *_failure("the server restarted before this request finished", "server"))
        self._thread = threading.Thread(target=self._work, name="tinker-worker", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- futures
    def submit(self, job: Job, idem_key: str | None) -> tuple[str, bool]:
        """Queue `job` unless `idem_key` was seen; (request id, queued)."""
        request_id, created = self.store.new_future(job.kind, idem_key, job.extra)
        if created:
            job.request_id = request_id
            with self._cond:
                self._queue.append(job)
                self._cond.notify()
        return request_id, created

    def submit_async(self, kind: str, idem_key: str | None, extra: dict[str, Any], work: Callable[[], Any]) -> str:
        """A future whose work is a coroutine on the event loop (sampling)."""
        request_id, created = self.store.new_future(kind, idem_key, extra)
        if created:
            task = asyncio.get_running_loop().create_task(self._run_async(request_id, work))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return request_id

    async def _run_async(self, request_id: str, work: Callable[[], Any]) -> None:
        try:
            content_type, payload = await work()
            self._finish(request_id, "done", content_type, payload)
        except Exception as e:
            self._finish(request_id, "failed", *_failure(f"{type(e).__name__}: {e}", "server"))

    def _finish(self, request_id: str, status: str, content_type: str, payload: bytes) -> None:
        self.store.finish(request_id, status, content_type, payload)
        with self._waiters_lock:
            waiters = self._waiters.pop(request_id, [])
        for loop, fut in waiters:
            loop.call_soon_threadsafe(lambda f=fut: f.done() or f.set_result(None))

    async def wait(self, request_id: str, timeout_s: float) -> FutureRow | None:
        """The future's row once finished, or still pending after `timeout_s` (the long poll)."""
        row = self.store.future(request_id)
        if row is None or row.status != "pending":
            return row
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        with self._waiters_lock:
            self._waiters.setdefault(request_id, []).append((loop, fut))
        row = self.store.future(request_id)  # it may have finished before the waiter was registered
        if row is not None and row.status == "pending":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout_s)
            row = self.store.future(request_id)
        return row

    # ---------------------------------------------------------------- the worker
    def _take(self) -> list[Job] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            first = self._queue.pop(0)
            if first.kind != "fwdbwd":
                return [first]
            batch, keep, blocked = [first], [], False
            assert first.fwdbwd is not None
            for job in self._queue:
                same = job.model_id == first.model_id
                if same and not blocked and job.kind == "fwdbwd" and _same_loss(job.fwdbwd, first.fwdbwd):
                    batch.append(job)
                else:
                    blocked = blocked or same
                    keep.append(job)
            self._queue[:] = keep
            return batch

    def _work(self) -> None:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # OpenMP's thread count is per calling thread
        while (jobs := self._take()) is not None:
            try:
                results = self._run_jobs(jobs)
            except Exception as e:
                category = "user" if isinstance(e, ValueError | KeyError) else "server"
                if category == "server":
                    traceback.print_exc()
                results = [("failed", *_failure(f"{type(e).__name__}: {e}", category))] * len(jobs)
            for job, (status, ctype, payload) in zip(jobs, results, strict=True):
                self._finish(job.request_id, status, ctype, payload)

    def _run_jobs(self, jobs: list[Job]) -> list[tuple[str, str, bytes]]:
        if jobs[0].kind != "fwdbwd":
            assert jobs[0].run is not None
            return [("done", *jobs[0].run())]
        first = jobs[0].fwdbwd
        assert first is not None
        parts = [FwdBwdPart(data=j.fwdbwd.data) for j in jobs if j.fwdbwd is not None]
        self.trainer.forward_backward(first.model_id, first.loss_fn, first.config, parts, first.forward_only)
        return [("done", wire.PROTO, wire.forward_backward_output(p.outputs or [], p.metrics or {})) for p in parts]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _same_loss(a: wire.FwdBwdRequest | None, b: wire.FwdBwdRequest | None) -> bool:
    assert a is not None and b is not None
    return (a.loss_fn, a.forward_only, a.config) == (b.loss_fn, b.forward_only, b.config)


def _failure(message: str, category: str) -> tuple[str, bytes]:
    return JSON, json.dumps({"error": message, "category": category}).encode()
