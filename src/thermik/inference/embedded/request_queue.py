"""The embedded engine's request queue and the scheduler thread that serves it.

Callers put requests in from any thread; the scheduler thread (started with the first request) waits here for
work, gathers a burst of arrivals, and takes the requests that admission lets in. Sessions that ended are noted
here too, for the thread to free their slots between two steps.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable

from thermik.cpu.openmp import release_thread_pool
from thermik.inference.embedded.requests import Request

_LIVE_QUEUES: weakref.WeakSet[RequestQueue] = weakref.WeakSet()


@atexit.register
def _stop_threads_at_exit() -> None:
    """Let scheduler threads finish their step before the interpreter (and torch's OpenMP runtime) shuts down."""
    for queue in list(_LIVE_QUEUES):
        queue.stop(timeout_s=5.0)


class RequestQueue:
    """Requests waiting for a slot, in arrival order, and the thread that serves them."""

    def __init__(self, max_batch_size: int, gather_window_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.gather_window_s = gather_window_s
        self._cond = threading.Condition()  # guards _pending, _ended_sessions and _closed
        self._pending: list[Request] = []
        self._ended_sessions: set[str] = set()
        self._closed = False
        self._thread: threading.Thread | None = None

    def put(self, requests: list[Request], serve: Callable[[], None]) -> None:
        """Queue `requests`; the first call starts the scheduler thread running `serve`."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._pending.extend(requests)
            if self._thread is None:
                self._thread = threading.Thread(target=serve, name="thermik-embedded-engine", daemon=True)
                _LIVE_QUEUES.add(self)
                self._thread.start()
            self._cond.notify_all()

    def requeue(self, requests: list[Request]) -> None:
        """Put taken requests back at the head of the queue (no slot was free for them)."""
        with self._cond:
            self._pending[:0] = requests

    def wait(self, has_running: Callable[[], bool]) -> bool:
        """Block the scheduler thread until there is work (queued or running requests); False once closed."""
        with self._cond:
            idle = not self._closed and not self._pending and not has_running()
        if idle:  # the callers get the CPU back without this thread's OpenMP workers in the way (openmp.py)
            release_thread_pool()
        with self._cond:
            while not self._closed and not self._pending and not has_running():
                self._cond.wait()
            return not self._closed

    def gather(self, quiet_s: float = 0.002) -> None:
        """When idle, wait until requests stop arriving for `quiet_s` (at most gather_window_s): a burst of
        episodes is admitted together, so its prefills batch and identical prompts share one."""
        deadline = time.perf_counter() + self.gather_window_s
        seen = -1
        while time.perf_counter() < deadline:
            with self._cond:
                count = len(self._pending)
            if count == seen or count >= self.max_batch_size:
                break
            seen = count
            time.sleep(quiet_s)

    def take(self, room: int, admissible: Callable[[list[Request]], int]) -> list[Request]:
        """The live requests at the head of the queue that fit in `room` free rows and that `admissible` (how many
        of these candidates may join) lets in; cancelled requests, or those failed with a step, are dropped."""
        with self._cond:
            live = [r for r in self._pending if not r.future.done()]
            count = admissible(live[: max(room, 0)])
            taken, self._pending = live[:count], live[count:]
        return taken

    def take_all(self) -> list[Request]:
        with self._cond:
            pending, self._pending = self._pending, []
        return pending

    def end_session(self, session_id: str) -> None:
        with self._cond:
            self._ended_sessions.add(session_id)

    def take_ended_sessions(self) -> set[str]:
        with self._cond:
            ended, self._ended_sessions = self._ended_sessions, set()
        return ended

    def stop(self, timeout_s: float | None = None) -> None:
        """Refuse new requests and let the scheduler thread finish its step and end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
