"""The scheduler thread's loop: wait for work, then one iteration after another, each under the model lock (so a
weight update lands between two): admit and prefill what the queue and the KV cache budget allow, then one decode
step of every running request."""

from __future__ import annotations

import threading

import torch

from thermik.inference.embedded.decode import Decoder
from thermik.inference.embedded.prefill import PrefillPlanner
from thermik.inference.embedded.records import SampleRecorder
from thermik.inference.embedded.request_queue import RequestQueue
from thermik.inference.embedded.requests import Request
from thermik.inference.embedded.scheduler import SlotScheduler


class SchedulerLoop:
    """What the scheduler thread runs (`serve`), over the engine's parts."""

    def __init__(
        self,
        queue: RequestQueue,
        scheduler: SlotScheduler,
        prefill: PrefillPlanner,
        decoder: Decoder,
        model_lock: threading.Lock,
        num_threads: int,
    ) -> None:
        """`num_threads`: torch threads of the scheduler thread; 0 inherits the process setting."""
        self.queue = queue
        self.scheduler = scheduler
        self.prefill = prefill
        self.decoder = decoder
        self.records: SampleRecorder = decoder.records
        self.model_lock = model_lock
        self.num_threads = num_threads

    def serve(self) -> None:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # OpenMP thread count is per calling thread
        while self.queue.wait(lambda: bool(self.scheduler.running())):
            if not self.scheduler.running():
                self.queue.gather()
            self.iterate()
        self.abort_all()

    def iterate(self) -> None:
        """One iteration: admit and prefill what the queue and the budget allow, then one decode step."""
        admitting: list[Request] = []
        try:
            with self.model_lock, torch.inference_mode():
                self.scheduler.release_sessions(self.queue.take_ended_sessions())
                admitting = self.scheduler.take_admissible(self.queue)
                if admitting:
                    self.prefill.admit(admitting, self.queue.requeue)
                self.decoder.step()
        except Exception as exc:  # a failed step fails its requests, not the engine
            self.scheduler.fail(exc, admitting)

    def abort_all(self) -> None:
        """Queued and running requests end with stop_reason "abort"."""
        for req in self.queue.take_all():
            req.finish("abort", self.records.version)
        self.scheduler.abort(self.records.version)
