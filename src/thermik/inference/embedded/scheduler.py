"""The embedded engine's scheduler: which requests run, in which cache slot, and which idle slots give way.

Admission: a request joins the running batch only while every running request could reach its longest length
(prompt + max_tokens) within the KV cache's byte budget, so a running batch never needs more than the budget; the
queue waits instead. Placement: a request takes its session's slot, else the free slot sharing the longest prefix
with it, else a new slot, else the least recently used parked one. Eviction: where the budget cannot hold every
slot at the length a step needs, idle slots (finished requests' prefixes, parked sessions) are evicted least
recently used first, and the kept slots are renumbered.
"""

from __future__ import annotations

from collections.abc import Sequence

from thermik.inference.embedded.request_queue import RequestQueue
from thermik.inference.embedded.requests import Request, Slot, common_prefix
from thermik.inference.kv_cache import KVCacheBudgetError, SlotKVCache

INITIAL_CACHE_LEN = 128  # positions per slot of a new (or emptied) KV cache; it grows by doubling


class SlotScheduler:
    """The cache slots and what each holds, over one `SlotKVCache`. Only the scheduler thread (or a caller holding
    the engine's model lock) touches them."""

    def __init__(self, cache: SlotKVCache, max_batch_size: int, max_positions: int, keep_buffers: bool) -> None:
        """`keep_buffers`: the cache's buffers must stay where they are (decode graphs read them), so dropping
        idle slots only forgets their tokens."""
        self.cache = cache
        self.slots: list[Slot] = []
        self.max_batch_size = max_batch_size
        self.max_positions = max_positions
        self.keep_buffers = keep_buffers

    def running(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.request is not None]

    # ------------------------------------------------------------------ the budget

    def positions(self, prompt_len: int, max_tokens: int) -> int:
        """Cache positions a request may need: its prompt and every sampled token but the last, plus the one
        spare position every step keeps (so an idle row of a dense decode step writes inside the cache)."""
        return max(prompt_len + 1, min(prompt_len + max_tokens, self.max_positions))

    def reserve(self, requests: Sequence[Request | None]) -> int:
        """The most positions any of `requests` may need (None entries: slots without a request)."""
        return max((self.positions(len(r.prompt_ids), r.sampling.max_tokens) for r in requests if r), default=0)

    def require_room(self, positions: int, key: str) -> None:
        """Fail when the budget cannot hold one sequence of `positions` (`key` names the setting they come from)."""
        if self.cache.fits(1, positions):
            return
        need, budget = positions * self.cache.bytes_per_position, self.cache.budget_bytes or 0
        raise KVCacheBudgetError(
            f"the KV cache budget ({budget / 2**30:.4g} GiB) cannot hold one sequence of {key} = {positions} "
            f"({need / 2**30:.4g} GiB for this model): set inference.kv_cache_gb to at least {need / 2**30:.3g}, or "
            f"lower {key}"
        )

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse at once a request that alone outgrows the cache budget (it would wait forever in the queue)."""
        positions = self.positions(prompt_len, max_tokens)
        if not self.cache.fits(1, positions):
            need, budget = positions * self.cache.bytes_per_position, self.cache.budget_bytes or 0
            raise ValueError(
                f"the KV cache budget cannot hold this request: prompt ({prompt_len} tokens) + max_tokens "
                f"({max_tokens}) need {positions} cached positions, {need / 2**30:.4g} GiB, and the budget is "
                f"{budget / 2**30:.4g} GiB; raise inference.kv_cache_gb (EmbeddedEngine(kv_cache_gb=...)) or "
                "shorten the prompt or max_tokens"
            )

    # ------------------------------------------------------------------ admission

    def take_admissible(self, queue: RequestQueue) -> list[Request]:
        """The queued requests that may join the running ones now (free rows and the budget allowing)."""
        running = self.running()
        return queue.take(self.max_batch_size - len(running), lambda live: self.admissible(running, live))

    def admissible(self, running: list[int], candidates: list[Request]) -> int:
        """How many of `candidates` (in queue order) can join the running requests while all of them together
        could still reach their longest length within the cache budget (slots x the longest length: the cache
        is rectangular)."""
        budget = self.cache.budget_positions
        if budget is None or not candidates:
            return len(candidates)
        longest = self.reserve([self.slots[i].request for i in running])
        for n, req in enumerate(candidates):
            longest = max(longest, self.reserve([req]))
            if (len(running) + n + 1) * longest > budget:
                return n
        return len(candidates)

    def release_sessions(self, ended: set[str]) -> None:
        """Ended sessions' idle slots become free for any request (their tokens stay reusable as a prefix)."""
        for slot in self.slots:
            if slot.session_id in ended and slot.request is None:
                slot.session_id = None

    def drop_cancelled(self, index: int) -> bool:
        slot = self.slots[index]
        if slot.request is not None and slot.request.future.cancelled():
            slot.request = None
            return True
        return False

    # ------------------------------------------------------------------ placement and eviction

    def place(self, req: Request, taken: set[int]) -> int | None:
        """The slot for `req`: its session's slot, else the reusable slot sharing the longest prefix with it
        (free before parked; parked ones are evicted least recently used first), else a new slot."""
        for i, slot in enumerate(self.slots):
            if req.session_id is not None and slot.session_id == req.session_id and slot.request is None:
                return i
        free = [i for i, s in enumerate(self.slots) if s.request is None and s.session_id is None and i not in taken]
        if free:
            return max(free, key=lambda i: (common_prefix(self.slots[i].tokens, req.prompt_ids), -i))
        if len(self.slots) < 2 * self.max_batch_size and self.cache.fits(len(self.slots) + 1, self.cache.max_len):
            self.slots.append(Slot())
            self.cache.ensure(len(self.slots), self.cache.max_len)
            return len(self.slots) - 1
        parked = [i for i, s in enumerate(self.slots) if s.request is None and i not in taken]
        return min(parked, key=lambda i: self.slots[i].last_used) if parked else None

    def make_room(self, need: int, running: list[int], admitted: Sequence[Request] = ()) -> None:
        """Called between steps, while no slot index is held: room in the cache for every slot at `need`
        positions, and for the `admitted` requests' slots. Where the budget cannot hold them all, the length
        becomes the longest that the running and admitted requests may need (no growth until the next admission;
        it also shrinks a length left over from longer requests) and idle slots are evicted, least recently used
        first (sessions of `admitted` requests last); the kept slots are renumbered."""
        cache = self.cache
        rows = len(running) + len(admitted)
        if cache.fits(max(len(self.slots), rows), max(need, cache.max_len)):
            cache.ensure(max(len(self.slots), rows), need)
            return
        assert cache.budget_positions is not None
        longest = self.reserve([self.slots[i].request for i in running] + list(admitted))
        length = max(need, longest if need > cache.max_len else min(longest, cache.max_len))
        sessions = {r.session_id for r in admitted if r.session_id is not None}
        idle = [i for i, s in enumerate(self.slots) if s.request is None]
        idle.sort(key=lambda i: (self.slots[i].session_id in sessions, self.slots[i].last_used))
        evicted = set(idle[: max(0, len(self.slots) - cache.budget_positions // length)])
        keep = [i for i in range(len(self.slots)) if i not in evicted]
        cache.resize(keep, max(len(keep), rows), length)
        self.slots = [self.slots[i] for i in keep]
        for slot in self.slots:
            if slot.request is None:  # a shorter cache keeps a shorter prefix (one position stays spare)
                slot.tokens = slot.tokens[: length - 1]

    def forget_idle(self) -> None:
        """Idle slots hold nothing reusable any more (new weights). With `keep_buffers` the cache keeps its buffers
        (the decode graphs read them: reallocating would mean capturing again); else it shrinks to the running
        slots (`drop_idle`)."""
        if not self.keep_buffers:
            self.drop_idle()
            return
        for slot in self.slots:
            if slot.request is None:
                slot.tokens, slot.session_id = [], None

    def drop_idle(self) -> None:
        """Drop the idle slots and shrink the cache to the running ones (one slot of INITIAL_CACHE_LEN when none)."""
        running = self.running()
        self.cache.resize(running, max(len(running), 1), self.cache.max_len if running else INITIAL_CACHE_LEN)
        self.slots = [self.slots[i] for i in running]

    # ------------------------------------------------------------------ ending requests

    def abort(self, version: int) -> None:
        """Running requests end with stop_reason "abort" (the engine is closing)."""
        for slot in self.slots:
            if slot.request is not None:
                slot.request.finish("abort", version)
                slot.request = None

    def fail(self, exc: Exception, admitting: list[Request]) -> None:
        """A step raised: its requests fail with `exc` (those taken from the queue but not placed in a slot yet,
        too: they would wait forever), and every slot is emptied."""
        for req in admitting:
            if not req.future.done():
                req.future.set_exception(exc)
        for slot in self.slots:
            if slot.request is not None and not slot.request.future.done():
                slot.request.future.set_exception(exc)
            slot.request, slot.tokens = None, []
