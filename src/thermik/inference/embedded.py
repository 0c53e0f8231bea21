"""The embedded engine (the default backend): continuous batching over a slot KV cache, in this process.

A scheduler thread owns the model. Each iteration it admits queued requests into cache slots, prefilling
only what no slot holds yet: the n samples of a group share one prefill, prompts admitted together forward the
prefix they share once (one system prompt), and a session's next turn (or any prompt that extends a cached
sequence) prefills only its new tokens. Then it runs one decode step for every
running sequence. A finished sequence frees its slot for the next request at once (continuous batching).
Weight updates take the model lock between two steps: running sequences continue on the new weights (their
cached keys/values stay as the old weights made them, as in PipelineRL) and every token records the weight
version that produced it; cached prefixes of finished requests and parked sessions are dropped.

The cache has a byte budget (`kv_cache_gb`). A request is admitted only while every running request could reach
its longest length (prompt + max_tokens) within it, so a running batch never needs more than the budget; the
queue waits instead. Idle slots (finished requests' prefixes, parked sessions) give way first: least recently used
ones are reused or evicted, and a parked session whose slot was evicted re-prefills its next turn.

Models the native forward does not cover fall back to `HFEngine` (static batches on transformers) with a
warning; see `embedded_engine`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import math
import sys
import threading
import time
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from thermik.cpu.engine_precision import apply_precision, projection_formats
from thermik.cpu.gemm import PROBE_ROWS
from thermik.cpu.openmp import release_thread_pool, to_thread_releasing
from thermik.inference.base import (
    Generation,
    SamplingParams,
    StopReason,
    StreamItem,
    TokenDelta,
    WeightSource,
    check_request,
    next_version,
)
from thermik.inference.decode_graphs import MODES, DecodeGraphs
from thermik.inference.hf_engine import HFEngine
from thermik.inference.kv_cache import KVCacheBudgetError, default_budget_bytes
from thermik.inference.native_model import NativeCausalLM
from thermik.inference.sampling import fused_sample, process_logits, sample, token_logprobs
from thermik.inference.weights import check_state, copy_state, load_state
from thermik.models.architecture import unsupported_reason

Detokenize = Callable[[list[int]], str]
MIN_SHARED_PREFIX = 16  # tokens: a shorter prefix shared by admitted prompts is not worth a forward of its own
INITIAL_CACHE_LEN = 128  # positions per slot of a new (or emptied) KV cache; it grows by doubling
_NATIVE_ONLY = ("detokenize", "gather_window_s", "reuse_prefixes", "num_threads", "kv_cache_gb", "decode_graphs")
_LIVE_ENGINES: weakref.WeakSet[EmbeddedEngine] = weakref.WeakSet()


@atexit.register
def _stop_engines_at_exit() -> None:
    """Let scheduler threads finish their step before the interpreter (and torch's OpenMP runtime) shuts down."""
    for engine in list(_LIVE_ENGINES):
        engine._stop_thread(timeout_s=5.0)


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: concurrent.futures.Future[Generation]
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    on_token: Callable[[], None] | None = None  # called by the scheduler thread after each sampled token

    def result(self, reason: StopReason, version: int) -> Generation:
        return Generation(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            stop_reason=reason,
            weight_version=self.versions[-1] if self.versions else version,
            weight_versions=self.versions,
            top_logprobs=self.top_logprobs if self.sampling.top_logprobs else None,
        )


@dataclass
class _Slot:
    """One cache row. `tokens` are the ids whose keys/values it holds; they stay valid after the request ends,
    so a later prompt with the same prefix reuses them (until the slot is given to another request)."""

    tokens: list[int] = field(default_factory=list)
    request: _Request | None = None
    next_token: int = 0  # sampled, not yet fed to the model
    session_id: str | None = None
    last_used: int = 0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class EmbeddedEngine:
    """InferenceEngine for Qwen2/Qwen3/Llama-shaped HF models living in this process; see the module docstring."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        seed: int = 0,
        detokenize: Detokenize | None = None,
        gather_window_s: float = 0.02,
        reuse_prefixes: bool = True,
        num_threads: int = 0,
        kv_cache_gb: float | None = None,
        weight_formats: tuple[str, ...] = ("blas",),
        decode_graphs: str = "auto",
    ) -> None:
        """`kv_cache_gb`: the KV cache's budget in GiB (2^30 bytes); None takes a quarter of the available RAM (on
        CUDA, of the free GPU memory; `kv_cache.default_budget_bytes` says why), `math.inf` sets no budget.
        `weight_formats`: the projections' weight formats to choose from (`NativeCausalLM`; cpu/engine_precision.py's
        `projection_formats` for a precision name). `decode_graphs`: "auto" replays the decode step as CUDA graphs on a
        GPU and keeps the native forward on a CPU; "capture", "eager" (the same fixed-shape step, not captured) or
        "off" (the native forward) force one (decode_graphs.py)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if kv_cache_gb is not None and not kv_cache_gb > 0:
            raise ValueError(f"kv_cache_gb must be > 0, got {kv_cache_gb}")
        self.model = model.eval()
        self.native = NativeCausalLM(model, weight_formats)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self.detokenize = detokenize
        self.gather_window_s = gather_window_s
        self.reuse_prefixes = reuse_prefixes  # False: every request prefills its whole prompt (for benchmarks)
        self.num_threads = num_threads  # torch threads of the scheduler thread; 0 inherits the process setting
        self.device = next(model.parameters()).device
        self._vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self.graphs = _decode_graphs(self.native, decode_graphs, self.device)
        self._version = 0
        if kv_cache_gb is None:
            budget = default_budget_bytes(self.device)
        else:
            budget = None if math.isinf(kv_cache_gb) else int(kv_cache_gb * 2**30)
        self._cache = self.native.new_cache(num_slots=8, max_len=INITIAL_CACHE_LEN, budget_bytes=budget)
        self._slots: list[_Slot] = []
        self._tick = 0
        self._model_lock = threading.Lock()  # held for each scheduler iteration and each weight update
        self._cond = threading.Condition()  # guards _pending and _closed
        self._pending: list[_Request] = []
        self._admitting: list[_Request] = []  # taken from the queue this iteration (failed with it, if it fails)
        self._ended_sessions: set[str] = set()
        self._closed = False
        self._thread: threading.Thread | None = None
        # Counters for tests and benchmarks.
        self.num_batches = 0  # admission rounds that ran a prefill
        self.num_forwards = 0
        self.num_prefill_tokens = 0

    @property
    def weight_version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ public API

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation:
        """Queue one request. `session_id` keeps its cache slot for the session's next turn (multi-turn episodes)."""
        future = self._submit([(prompt_ids, sampling, session_id)])[0]
        release_thread_pool()  # this thread waits now: its OpenMP workers would slow the scheduler's (openmp.py)
        return await asyncio.wrap_future(future)

    def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> AsyncIterator[StreamItem]:
        """Queue one request now (bad input raises here, before anything is streamed) and return an iterator of
        `TokenDelta`s as tokens are sampled, then the finished `Generation`. Closing the iterator early cancels
        the request."""
        loop = asyncio.get_running_loop()
        wake: asyncio.Queue[None] = asyncio.Queue()

        def notify() -> None:  # runs on the scheduler thread: it must not raise there
            with contextlib.suppress(RuntimeError):  # the consumer's loop is closed; its request is being cancelled
                loop.call_soon_threadsafe(wake.put_nowait, None)

        req = self._enqueue([(prompt_ids, sampling, session_id)], on_token=notify)[0]
        req.future.add_done_callback(lambda _: notify())
        release_thread_pool()
        return self._drain(req, wake)

    async def _drain(self, req: _Request, wake: asyncio.Queue[None]) -> AsyncIterator[StreamItem]:
        future, sent = req.future, 0
        try:
            while True:
                await wake.get()
                done = future.done()
                count = len(req.logprobs)  # appended after the token id: the lists agree up to here
                if count > sent:
                    tops = req.top_logprobs[sent:count] if req.sampling.top_logprobs else None
                    yield TokenDelta(req.token_ids[sent:count], req.logprobs[sent:count], tops)
                    sent = count
                if done:
                    yield future.result()
                    return
        finally:
            future.cancel()  # a consumer that stops early frees the slot (no-op once finished)

    def generate_batch(self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingParams]) -> list[Generation]:
        """Blocking: queue all prompts at once and wait for every result (safe to call from any thread)."""
        if len(prompts) != len(samplings):
            raise ValueError(f"got {len(prompts)} prompts but {len(samplings)} sampling params")
        futures = self._submit([(p, s, None) for p, s in zip(prompts, samplings, strict=True)])
        release_thread_pool()
        return [f.result() for f in futures]

    def end_session(self, session_id: str) -> None:
        """The episode is over: its slot becomes free for new requests (its cached tokens stay reusable as a
        prefix). Without this, parked sessions hold their slots until evicted, and running rows spread over many
        slots (slower, sparse decode steps)."""
        with self._cond:
            self._ended_sessions.add(session_id)

    async def update_weights(self, source: WeightSource, version: int | None = None) -> int:
        """Copy new weights in place between two decode steps. Returns the new version (`version` when given)."""
        return await to_thread_releasing(self.update_weights_sync, source, version)

    def update_weights_sync(self, source: WeightSource, version: int | None = None) -> int:
        state = load_state(source)
        params = check_state(self.model, state)
        with self._model_lock:
            copy_state(params, state)
            self.native.refresh()
            self._forget_idle_slots()  # cached prefixes of finished requests were computed by the old weights
            self._version = next_version(self._version, version)
            return self._version

    def release_idle_cache(self) -> None:
        """Drop the idle slots (finished requests' prefixes, parked sessions) and shrink the KV cache to the running
        requests' slots, giving its memory back to the process. A synchronous run calls it when a step's sampling
        ends (runs/step.py): the next weight update would drop those prefixes anyway, and the trainer's memory peak
        then does not add to the cache's. The next admission regrows the cache in one reallocation."""
        with self._model_lock:
            self._drop_idle_slots()

    def _forget_idle_slots(self) -> None:
        """Idle slots hold nothing reusable any more. With decode graphs the cache keeps its buffers (the graphs read
        them: reallocating would mean capturing again); else it shrinks to the running slots (`_drop_idle_slots`)."""
        if self.graphs is None:
            self._drop_idle_slots()
            return
        for slot in self._slots:
            if slot.request is None:
                slot.tokens, slot.session_id = [], None

    def _drop_idle_slots(self) -> None:
        running = self._running()
        self._cache.resize(running, max(len(running), 1), self._cache.max_len if running else INITIAL_CACHE_LEN)
        self._slots = [self._slots[i] for i in running]

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[tuple[float, int]]:
        """(logprob, rank) of each token after the first given the tokens before it, at temperature 1 (rank 1 is the
        most likely token): one forward of the model between two scheduler iterations, never during a weight update.
        What a teacher returns in on-policy distillation (`/v1/completions` `prompt_logprobs`)."""
        return await asyncio.to_thread(self._prompt_logprobs, list(token_ids))

    def _prompt_logprobs(self, ids: list[int]) -> list[tuple[float, int]]:
        if len(ids) > self.native.max_positions:
            raise ValueError(f"{len(ids)} tokens exceed the model's context of {self.native.max_positions}")
        tokens = torch.tensor([ids], device=self.device)
        with self._model_lock, torch.inference_mode():
            logits = self.model(input_ids=tokens, use_cache=False).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(1, tokens[0, 1:, None])
        ranks = (logp > chosen).sum(dim=-1) + 1
        return list(zip(chosen[:, 0].tolist(), ranks.tolist(), strict=True))

    async def close(self) -> None:
        """Stop serving: running and queued requests end with stop_reason "abort"; new ones are refused."""
        await asyncio.to_thread(self._stop_thread)
        self._abort_all()

    def _stop_thread(self, timeout_s: float | None = None) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ requests

    def _submit(self, items: list[tuple[Sequence[int], SamplingParams, str | None]]) -> list[concurrent.futures.Future]:
        return [r.future for r in self._enqueue(items)]

    def _enqueue(
        self, items: list[tuple[Sequence[int], SamplingParams, str | None]], on_token: Callable[[], None] | None = None
    ) -> list[_Request]:
        for prompt_ids, sampling, _ in items:
            check_request(prompt_ids, sampling, self._vocab_size)
            if sampling.stop and self.detokenize is None:
                raise ValueError("sampling.stop (stop strings) needs an engine built with detokenize=...")
            self._check_fits(len(prompt_ids), sampling.max_tokens)
        requests = [
            _Request(
                prompt_ids=list(prompt_ids),
                sampling=sampling,
                session_id=session_id,
                future=concurrent.futures.Future(),
                stop_ids=self.eos_token_ids | frozenset(sampling.stop_token_ids),
                generator=None if sampling.seed is None else torch.Generator(self.device).manual_seed(sampling.seed),
                on_token=on_token,
            )
            for prompt_ids, sampling, session_id in items
        ]
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._pending.extend(requests)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="thermik-embedded-engine", daemon=True)
                _LIVE_ENGINES.add(self)
                self._thread.start()
            self._cond.notify_all()
        return requests

    def _positions(self, prompt_len: int, max_tokens: int) -> int:
        """Cache positions a request may need: its prompt and every sampled token but the last, plus the one
        spare position every step keeps (so an idle row of a dense decode step writes inside the cache)."""
        return max(prompt_len + 1, min(prompt_len + max_tokens, self.native.max_positions))

    def _reserve(self, requests: Sequence[_Request | None]) -> int:
        """The most positions any of `requests` may need (None entries: slots without a request)."""
        return max((self._positions(len(r.prompt_ids), r.sampling.max_tokens) for r in requests if r), default=0)

    def require_room(self, positions: int, key: str = "rollout.max_sequence_length") -> None:
        """Fail at start, before any work, when the KV cache budget cannot hold one sequence of `positions` (`key`
        names the setting they come from)."""
        if self._cache.fits(1, positions):
            return
        need, budget = positions * self._cache.bytes_per_position, self._cache.budget_bytes or 0
        raise KVCacheBudgetError(
            f"the KV cache budget ({budget / 2**30:.4g} GiB) cannot hold one sequence of {key} = {positions} "
            f"({need / 2**30:.4g} GiB for this model): set inference.kv_cache_gb to at least {need / 2**30:.3g}, or "
            f"lower {key}"
        )

    def _check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse at once a request that alone outgrows the cache budget (it would wait forever in the queue)."""
        positions = self._positions(prompt_len, max_tokens)
        if not self._cache.fits(1, positions):
            need, budget = positions * self._cache.bytes_per_position, self._cache.budget_bytes or 0
            raise ValueError(
                f"the KV cache budget cannot hold this request: prompt ({prompt_len} tokens) + max_tokens "
                f"({max_tokens}) need {positions} cached positions, {need / 2**30:.4g} GiB, and the budget is "
                f"{budget / 2**30:.4g} GiB; raise inference.kv_cache_gb (EmbeddedEngine(kv_cache_gb=...)) or "
                "shorten the prompt or max_tokens"
            )

    def _finish(self, req: _Request, reason: StopReason) -> None:
        if not req.future.done():
            req.future.set_result(req.result(reason, self._version))

    def _abort_all(self) -> None:
        with self._cond:
            pending, self._pending = self._pending, []
        for req in pending:
            self._finish(req, "abort")
        for slot in self._slots:
            if slot.request is not None:
                self._finish(slot.request, "abort")
                slot.request = None

    # ------------------------------------------------------------------ scheduler

    def _running(self) -> list[int]:
        return [i for i, s in enumerate(self._slots) if s.request is not None]

    def _serve(self) -> None:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # OpenMP thread count is per calling thread
        while True:
            with self._cond:
                idle = not self._closed and not self._pending and not self._running()
            if idle:  # the callers get the CPU back without this thread's OpenMP workers in the way (openmp.py)
                release_thread_pool()
            with self._cond:
                while not self._closed and not self._pending and not self._running():
                    self._cond.wait()
                if self._closed:
                    break
            if not self._running():
                self._gather_window()
            self._admitting = []
            try:
                with self._model_lock, torch.inference_mode():
                    self._admit()
                    self._decode_step()
            except Exception as exc:  # a failed step fails its requests, not the engine
                for req in self._admitting:  # those not placed in a slot yet would wait forever
                    if not req.future.done():
                        req.future.set_exception(exc)
                for slot in self._slots:
                    if slot.request is not None and not slot.request.future.done():
                        slot.request.future.set_exception(exc)
                    slot.request, slot.tokens = None, []
        self._abort_all()

    def _gather_window(self, quiet_s: float = 0.002) -> None:
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

    def _take_pending(self) -> list[_Request]:
        running = self._running()
        room = self.max_batch_size - len(running)
        with self._cond:
            live = [r for r in self._pending if not r.future.done()]  # cancelled, or failed with a step
            count = self._admissible(running, live[: max(room, 0)])
            taken, self._pending = live[:count], live[count:]
        return taken

    def _admissible(self, running: list[int], candidates: list[_Request]) -> int:
        """How many of `candidates` (in queue order) can join the running requests while all of them together
        could still reach their longest length within the cache budget (slots x the longest length: the cache
        is rectangular)."""
        budget = self._cache.budget_positions
        if budget is None or not candidates:
            return len(candidates)
        longest = self._reserve([self._slots[i].request for i in running])
        for n, req in enumerate(candidates):
            longest = max(longest, self._reserve([req]))
            if (len(running) + n + 1) * longest > budget:
                return n
        return len(candidates)

    def _make_room(self, need: int, running: list[int], admitted: Sequence[_Request] = ()) -> None:
        """Called between steps, while no slot index is held: room in the cache for every slot at `need`
        positions, and for the `admitted` requests' slots. Where the budget cannot hold them all, the length
        becomes the longest that the running and admitted requests may need (no growth until the next admission;
        it also shrinks a length left over from longer requests) and idle slots are evicted, least recently used
        first (sessions of `admitted` requests last); the kept slots are renumbered."""
        cache = self._cache
        rows = len(running) + len(admitted)
        if cache.fits(max(len(self._slots), rows), max(need, cache.max_len)):
            cache.ensure(max(len(self._slots), rows), need)
            return
        assert cache.budget_positions is not None
        longest = self._reserve([self._slots[i].request for i in running] + list(admitted))
        length = max(need, longest if need > cache.max_len else min(longest, cache.max_len))
        sessions = {r.session_id for r in admitted if r.session_id is not None}
        idle = [i for i, s in enumerate(self._slots) if s.request is None]
        idle.sort(key=lambda i: (self._slots[i].session_id in sessions, self._slots[i].last_used))
        evicted = set(idle[: max(0, len(self._slots) - cache.budget_positions // length)])
        keep = [i for i in range(len(self._slots)) if i not in evicted]
        cache.resize(keep, max(len(keep), rows), length)
        self._slots = [self._slots[i] for i in keep]
        for slot in self._slots:
            if slot.request is None:  # a shorter cache keeps a shorter prefix (one position stays spare)
                slot.tokens = slot.tokens[: length - 1]

    def _place(self, req: _Request, taken: set[int]) -> int | None:
        """The slot for `req`: its session's slot, else the reusable slot sharing the longest prefix with it
        (free before parked; parked ones are evicted least recently used first), else a new slot."""
        for i, slot in enumerate(self._slots):
            if req.session_id is not None and slot.session_id == req.session_id and slot.request is None:
                return i
        free = [i for i, s in enumerate(self._slots) if s.request is None and s.session_id is None and i not in taken]
        if free:
            return max(free, key=lambda i: (_common_prefix(self._slots[i].tokens, req.prompt_ids), -i))
        if len(self._slots) < 2 * self.max_batch_size and self._cache.fits(len(self._slots) + 1, self._cache.max_len):
            self._slots.append(_Slot())
            self._cache.ensure(len(self._slots), self._cache.max_len)
            return len(self._slots) - 1
        parked = [i for i, s in enumerate(self._slots) if s.request is None and i not in taken]
        return min(parked, key=lambda i: self._slots[i].last_used) if parked else None

    def _release_ended_sessions(self) -> None:
        with self._cond:
            ended, self._ended_sessions = self._ended_sessions, set()
        for slot in self._slots:
            if slot.session_id in ended and slot.request is None:
                slot.session_id = None

    def _admit(self) -> None:
        self._release_ended_sessions()
        self._admitting = requests = self._take_pending()
        if not requests:
            return
        self._make_room(max(len(r.prompt_ids) + 1 for r in requests), self._running(), requests)
        taken: set[int] = set()
        leaders: dict[tuple[int, ...], int] = {}  # prompt -> slot prefilling it this round
        prefill: list[tuple[int, int]] = []  # (slot, cached tokens already valid in it)
        followers: list[tuple[int, int]] = []  # (slot, leader slot)
        for n, req in enumerate(requests):
            index = self._place(req, taken)
            if index is None:  # every slot is busy: back to the queue
                with self._cond:
                    self._pending[:0] = requests[n:]
                break
            taken.add(index)
            slot = self._slots[index]
            slot.request, slot.session_id = req, req.session_id
            key = tuple(req.prompt_ids) if self.reuse_prefixes else (n,)
            if key in leaders:
                followers.append((index, leaders[key]))
                continue
            leaders[key] = index
            cached = min(_common_prefix(slot.tokens, req.prompt_ids), len(req.prompt_ids) - 1)
            donor, shared = self._best_donor(req.prompt_ids, exclude=taken) if self.reuse_prefixes else (-1, 0)
            cached = cached if self.reuse_prefixes else 0
            if shared > cached:
                self._cache.copy_slot(donor, index, shared)
                cached = shared
            slot.tokens = req.prompt_ids[:cached]
            prefill.append((index, cached))
        if not prefill:
            return
        logits = self._prefill(self._prefill_shared_prefix(prefill))
        rows = {index: logits[r] for r, (index, _) in enumerate(prefill)}
        copies: dict[int, list[int]] = {}  # leader slot -> its followers' slots
        for index, leader in followers:
            copies.setdefault(leader, []).append(index)
            rows[index] = rows[leader]
        for leader, indices in copies.items():
            self._cache.copy_slot(leader, indices, len(self._slots[leader].tokens))
            for index in indices:
                self._slots[index].tokens = list(self._slots[leader].tokens)
        order = sorted(rows)
        self._sample_and_record(order, torch.stack([rows[i] for i in order]))

    def _best_donor(self, prompt: list[int], exclude: set[int]) -> tuple[int, int]:
        best, shared = -1, 0
        for i, slot in enumerate(self._slots):
            if i in exclude or not slot.tokens:
                continue
            n = _common_prefix(slot.tokens, prompt)
            if n > shared:
                best, shared = i, n
        return best, min(shared, len(prompt) - 1)

    def _prefill_shared_prefix(self, prefill: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Prompts admitted together that share a prefix none of them holds (a step's prompts under one system
        prompt, after a weight update dropped the cached ones) forward it once, in the first of them, and copy it
        to the others; returns `prefill` (slot, cached positions) with their cached positions moved past it.

        The prefix is the one the rows share with the first prompt lacking at least MIN_SHARED_PREFIX of its
        tokens; a row joins when that gains it as many. Copies are bit-exact, so results do not change."""
        if not self.reuse_prefixes:
            return prefill
        prompts = {i: self._slots[i].request.prompt_ids for i, _ in prefill}
        first = next((prompts[i] for i, cached in prefill if len(prompts[i]) - 1 - cached >= MIN_SHARED_PREFIX), None)
        if first is None:
            return prefill
        reach = {i: min(_common_prefix(first, prompts[i]), len(prompts[i]) - 1) for i, _ in prefill}
        members = {i for i, cached in prefill if reach[i] - cached >= MIN_SHARED_PREFIX}
        shared = min((reach[i] for i in members), default=0)
        lacking = [(i, cached) for i, cached in prefill if i in members and cached < shared]
        if len(lacking) < 2:
            return prefill
        anchor, cached = lacking[0]
        self._prefill_forward([(anchor, cached, prompts[anchor][cached:shared])])
        others = [i for i, _ in lacking[1:]]
        self._cache.copy_slot(anchor, others, shared)
        for i in others:
            self._slots[i].tokens = prompts[i][:shared]
        return [(i, max(cached, shared) if i in members else cached) for i, cached in prefill]

    def _prefill(self, prefill: list[tuple[int, int]]) -> torch.Tensor:
        """Forward the uncached prompt tokens of every admitted leader; logits at each prompt's end."""
        rows = [(i, cached, self._slots[i].request.prompt_ids[cached:]) for i, cached in prefill]
        logits = torch.cat([self._prefill_forward(group) for group in self._prefill_groups(rows)])
        self.num_batches += 1
        return logits

    def _prefill_groups(self, rows: list[tuple[int, int, list[int]]]) -> list[list[tuple[int, int, list[int]]]]:
        """All rows in one padded forward, unless its span (the longest cached prefix + the widest new part)
        would outgrow the cache budget: then consecutive groups whose spans fit (a row alone always fits)."""
        groups: list[list[tuple[int, int, list[int]]]] = [[]]
        start = width = 0
        for row in rows:
            grown = max(start, row[1]), max(width, len(row[2]))
            if groups[-1] and not self._cache.fits(len(self._slots), sum(grown) + 1):
                groups.append([])
                grown = row[1], len(row[2])
            groups[-1].append(row)
            start, width = grown
        return groups

    def _prefill_forward(self, rows: list[tuple[int, int, list[int]]]) -> torch.Tensor:
        """One padded forward over `rows` (slot, cached positions, new tokens)."""
        width = max(len(new) for _, _, new in rows)
        tokens = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        for r, (_, _, new) in enumerate(rows):
            tokens[r, : len(new)] = torch.tensor(new)
        starts = torch.tensor([cached for _, cached, _ in rows])
        last = torch.tensor([len(new) - 1 for _, _, new in rows])
        self._cache.ensure(len(self._slots), int((starts + width).max()) + 1)
        logits = self.native.forward(tokens, torch.tensor([i for i, _, _ in rows]), starts, last, self._cache)
        for index, _, new in rows:
            self._slots[index].tokens.extend(new)
        self.num_forwards += 1
        self.num_prefill_tokens += sum(len(new) for _, _, new in rows)
        return logits

    def _decode_step(self) -> None:
        """Feed every running sequence its last sampled token; sample the next one."""
        running = [i for i in self._running() if not self._drop_cancelled(i)]
        if not running:
            return
        # Idle rows of a dense step write at their length, which every slot keeps below the cache's.
        self._make_room(max(len(self._slots[i].tokens) for i in running) + 2, running)
        running = self._running()  # renumbered if idle slots were evicted
        if self.graphs is not None and self.graphs.fits(len(running)):
            return self._decode_step_static(running)
        hi = running[-1] + 1
        dense = 2 * len(running) >= hi  # mostly-busy rows: compute on the contiguous slice, reading views
        index = list(range(hi)) if dense else running
        tokens = torch.tensor([[self._slots[i].next_token] for i in index])
        starts = torch.tensor([len(self._slots[i].tokens) for i in index])
        rows = slice(0, hi) if dense else torch.tensor(running)
        logits = self.native.forward(tokens, rows, starts, torch.zeros(len(index), dtype=torch.long), self._cache)
        self.num_forwards += 1
        for i in running:
            self._slots[i].tokens.append(self._slots[i].next_token)
        self._sample_and_record(running, logits[running] if dense else logits)

    def _decode_step_static(self, running: list[int]) -> None:
        """`_decode_step` as one fixed-shape step (a CUDA graph replay on a GPU): decode_graphs.py."""
        slots = [self._slots[i] for i in running]
        logits = self.graphs.decode(self._cache, [s.next_token for s in slots], running, [len(s.tokens) for s in slots])
        self.num_forwards += 1
        for slot in slots:
            slot.tokens.append(slot.next_token)
        self._sample_and_record(running, logits)

    def _drop_cancelled(self, index: int) -> bool:
        slot = self._slots[index]
        if slot.request is not None and slot.request.future.cancelled():
            slot.request = None
            return True
        return False

    def _sample_and_record(self, indices: list[int], logits: torch.Tensor) -> None:
        requests = [self._slots[i].request for i in indices]
        params = [r.sampling for r in requests]
        knobs = {(p.temperature, p.top_k, p.top_p, p.min_p) for p in params}
        if len(knobs) == 1:  # one setting for all rows (the usual decode batch): plain numbers, no per-row tensors
            temperature, top_k, top_p, min_p = knobs.pop()
        else:
            temperature = torch.tensor([p.temperature for p in params])
            top_k, top_p, min_p = (torch.tensor([getattr(p, k) for p in params]) for k in ("top_k", "top_p", "min_p"))
        generators = [r.generator for r in requests]
        fused = fused_sample(logits, temperature, top_k, top_p, min_p, self._generator, generators)
        if fused is None:
            ids = sample(process_logits(logits, temperature, top_k, top_p, min_p), self._generator, generators)
            logp_t = token_logprobs(logits, ids, temperature)
            if logits.is_cuda:  # one copy to the host (one synchronisation) for the step's ids and logprobs
                ids, logp = _to_host(ids, logp_t)
            else:
                logp = logp_t.tolist()
        else:
            ids, logp = fused[0], fused[1].tolist()
        top = self._top_logprobs(logits, temperature, params)
        self._tick += 1
        for row, (index, req, token) in enumerate(zip(indices, requests, ids.tolist(), strict=True)):
            req.token_ids.append(token)
            req.logprobs.append(logp[row])
            req.versions.append(self._version)
            if top is not None and params[row].top_logprobs:
                k = params[row].top_logprobs
                req.top_logprobs.append(dict(zip(top[1][row, :k].tolist(), top[0][row, :k].tolist(), strict=True)))
            reason = self._stop_reason(req, token)
            slot = self._slots[index]
            slot.next_token, slot.last_used = token, self._tick
            if reason is not None:
                self._finish(req, reason)
                slot.request = None
            elif req.on_token is not None:
                req.on_token()  # (a finished request notifies through its future)

    def _top_logprobs(
        self, logits: torch.Tensor, temperature: float | torch.Tensor, params: list[SamplingParams]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        k = max(p.top_logprobs for p in params)
        if k == 0:
            return None
        temp = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).expand(logits.shape[0])
        temp = torch.where(temp == 0, torch.ones_like(temp), temp)
        return (logits.float() / temp[:, None]).log_softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)

    def _stop_reason(self, req: _Request, token: int) -> StopReason | None:
        if token in req.stop_ids:
            return "stop"
        if req.sampling.stop and self.detokenize is not None:
            text = self.detokenize(req.token_ids)
            if any(s in text for s in req.sampling.stop):
                return "stop"
        if len(req.token_ids) >= req.sampling.max_tokens:
            return "length"
        if len(req.prompt_ids) + len(req.token_ids) >= self.native.max_positions:
            return "length"
        return None


def _to_host(ids: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """(ids on the CPU, logprobs as floats) in one device-to-host copy (float64 holds every token id exactly)."""
    both = torch.stack([ids.double(), logprobs.double()]).cpu()
    return both[0].long(), both[1].tolist()


def _decode_graphs(native: NativeCausalLM, mode: str, device: torch.device) -> DecodeGraphs | None:
    """The engine's fixed-shape decode step for `mode` ("auto": captured on CUDA, none elsewhere), or None."""
    if mode not in ("auto", "off", *MODES):
        raise ValueError(f"decode_graphs must be 'auto', 'off', 'capture' or 'eager', got {mode!r}")
    if mode == "auto":
        mode = "capture" if device.type == "cuda" else "off"
    return None if mode == "off" else DecodeGraphs(native, mode)


def embedded_engine(
    model: PreTrainedModel, precision: str = "model", precision_asked_by: str | None = None, **kwargs
) -> EmbeddedEngine | HFEngine:
    """The embedded engine for `model`: native continuous batching when supported, else transformers (warned).
    `precision` ("model", "float32", "bfloat16", "bf16-weights", "int8", "auto"; cpu/engine_precision.py) casts `model`
    in place first: the engine owns it. `precision_asked_by`: what asked for it, for the log line (default
    inference.precision)."""
    apply_precision(model, precision, precision_asked_by)
    reason = unsupported_reason(model)
    param = next(model.parameters())
    formats = projection_formats(precision, param.dtype, param.device)
    if reason is None:
        engine = EmbeddedEngine(model, weight_formats=formats, **kwargs)
        if formats != ("blas",):
            times = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in engine.native.format_times.items())
            chosen = f"thermik embedded engine: projection weights {engine.native.weight_format}"
            print(chosen + (f" (timed at {PROBE_ROWS} rows: {times})" if times else ""), file=sys.stderr)
        return engine
    if formats != ("blas",) and len(formats) == 1:
        raise ValueError(
            f"precision {precision!r} needs the native engine, which does not support this model: {reason}"
        )
    warnings.warn(
        f"embedded engine: {reason}; falling back to static batches on transformers (slower, no session reuse)",
        stacklevel=2,
    )
    for native_only in _NATIVE_ONLY:
        kwargs.pop(native_only, None)
    return HFEngine(model, **kwargs)
